"""kvrouter as a user gets it: the wheel, installed with its runtime dependencies only.

The wheel is built from a copy of this checkout and installed into a fresh virtualenv in a
temporary folder outside the checkout; the copy is deleted before anything runs. Every command
runs from yet another folder, with the checkout on neither sys.path nor PYTHONPATH, so nothing
can come from the source tree by accident: presets, the generated gossip code and every module
must be in the wheel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from router.core.blocks import RoutingText, block_keys
from router.core.simulator import POOLED, SimResult
from router.presets import DEFAULT, NAMES
from tests.support import (
    LOOPBACK,
    ROOT,
    Proc,
    free_port,
    free_ports,
    metric,
    start_kvrouter,
    wait_until,
)

# Building and installing the wheel is part of the first test that needs it.
INSTALL_TIMEOUT_SECONDS = 600
# What a user's `pip install .` never sees: version control, environments, caches, old builds.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "*.so"
)
# Variables that could put the checkout (or another environment) on the import path.
IMPORT_PATH_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")


@dataclass(frozen=True)
class Installed:
    """A virtualenv holding the installed wheel, and where and how to run it."""

    wheel: Path
    venv: Path
    home: Path  # an empty folder outside the checkout, the working directory of every command
    env: dict[str, str]

    @property
    def kvrouter(self) -> str:
        return str(self.venv / "bin" / "kvrouter")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(
        self,
        args: Sequence[str],
        tmp_path: Path,
        *,
        port: int | None = None,
        ready_path: str = "/health",
        env: dict[str, str] | None = None,
    ) -> Proc:
        return start_kvrouter(
            args,
            tmp_path,
            port=port,
            ready_path=ready_path,
            env=env,
            command=[self.kvrouter],
            cwd=self.home,
            base_env=self.env,
        )


def pip(python: str | Path, *args: str | Path, env: dict[str, str] | None = None) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", *map(str, args)]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_SECONDS
    )
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"


def outside_checkout(path: Path) -> bool:
    return not path.resolve().is_relative_to(ROOT)


def clean_env(venv: Path) -> dict[str, str]:
    """This environment without anything that leads imports to the checkout or .venv."""
    env = {k: v for k, v in os.environ.items() if k not in {*IMPORT_PATH_VARIABLES, "VIRTUAL_ENV"}}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and outside_checkout(Path(p))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    with tempfile.TemporaryDirectory(prefix="kvrouter-installed-") as tmp:
        base = Path(tmp).resolve()
        assert outside_checkout(base), f"the temporary folder {base} is inside the checkout"
        source, dist, venv, home = base / "source", base / "dist", base / "venv", base / "home"
        shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
        pip(sys.executable, "wheel", "--no-deps", "--wheel-dir", dist, source)
        (wheel,) = dist.glob("kvrouter-*.whl")
        shutil.rmtree(source)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
        env = clean_env(venv)
        # The runtime dependencies come from the package index, as for a user; no extras.
        pip(venv / "bin" / "python", "install", wheel, env=env)
        home.mkdir()
        yield Installed(wheel, venv, home, env)


def peer_alive(replica: Proc) -> bool:
    return metric(replica, "kvrouter_gossip_peers", state="alive") >= 1


# -- what the wheel is built from ----------------------------------------------------------------


def test_packages_listed_in_pyproject_are_the_package_folders() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "router").rglob("__init__.py")
    }
    mapped = {name: ROOT / folder for name, folder in setuptools.get("package-dir", {}).items()}
    listed = set(setuptools["packages"])
    assert listed - set(mapped) == folders, "pyproject.toml [tool.setuptools] packages is stale"
    assert mapped.keys() <= listed
    assert (mapped["router.policies"] / "__init__.py").is_file()
    assert sorted(p.stem for p in mapped["router.policies"].glob("*.yaml")) == sorted(NAMES)


# -- the installed package -------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 60)
def test_wheel_holds_every_module_preset_and_the_generated_code(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "router").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules - names == set()
    presets = {f"router/policies/{name}.yaml" for name in NAMES}
    generated = {"router/gossip/pb/gossip_pb2.py", "router/gossip/pb/gossip_pb2.pyi"}
    assert (presets | generated | {"router/py.typed"}) - names == set()


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 60)
def test_installed_package_imports_from_the_venv_without_dev_tools(installed: Installed) -> None:
    probe = (
        "import importlib.util, json, sys, router, router.gossip.wire\n"
        "print(json.dumps({'router': router.__file__, 'path': sys.path,"
        " 'absent': [m for m in ('grpc_tools', 'pytest', 'mypy')"
        " if importlib.util.find_spec(m) is None]}))"
    )
    res = installed.run(installed.python, "-c", probe)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert Path(found["router"]).resolve().is_relative_to(installed.venv)
    assert [p for p in found["path"] if p and not outside_checkout(Path(p))] == []
    assert found["absent"] == ["grpc_tools", "pytest", "mypy"]


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 60)
def test_installed_package_runs_the_compiled_decision_code(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        assert [n for n in whl.namelist() if n.startswith("router/core/_hotpath.")]
    probe = (
        "import json\n"
        "from router.core import hotpath\n"
        "from router.core.blocks import RoutingText, block_keys\n"
        "keys = block_keys(RoutingText('m', text='x' * 2000), 512)\n"
        "print(json.dumps({'compiled': hotpath.compiled(), 'keys': keys,"
        " 'file': hotpath.native and hotpath.native.__file__}))"
    )
    res = installed.run(installed.python, "-W", "error", "-c", probe)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert found["compiled"] is True
    assert Path(found["file"]).resolve().is_relative_to(installed.venv)
    assert found["keys"] == block_keys(RoutingText("m", text="x" * 2000), 512)


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 60)
def test_installed_policy_check_finds_every_preset_by_name(installed: Installed) -> None:
    res = installed.run(installed.kvrouter, "policy", "check", DEFAULT)
    assert res.returncode == 0, res.stderr
    assert f"ok: {DEFAULT}" in res.stdout
    res = installed.run(installed.kvrouter, "policy", "check", *NAMES)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("ok:") == len(NAMES)


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)
def test_installed_simulate_synthetic_json(installed: Installed) -> None:
    res = installed.run(installed.kvrouter, "simulate", "--synthetic", "--workers", "4", "--json")
    assert res.returncode == 0, res.stderr
    results = json.loads(res.stdout)
    assert [r["policy"] for r in results] == [DEFAULT, POOLED]
    fields = {f.name for f in dataclasses.fields(SimResult)}
    for r in results:
        assert set(r) == fields
        assert r["requests"] > 0 and 0 < r["cached_tokens"] <= r["prompt_tokens"]
        assert 0.0 < r["hit_ratio"] <= 1.0
    assert results[0]["requests"] == results[1]["requests"]


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)
def test_installed_serve_replicas_gossip_with_each_other(
    installed: Installed, tmp_path: Path, procs: list[Proc]
) -> None:
    engine = installed.start(["engine-sim", "--fast"], tmp_path)
    procs.append(engine)
    gossip_a, gossip_b, http_a, http_b = free_ports(4)
    secret = {"KVROUTER_GOSSIP_SECRET": secrets.token_hex(16)}  # 32 bytes
    replicas = []
    for http, own, peer in ((http_a, gossip_a, gossip_b), (http_b, gossip_b, gossip_a)):
        args = [
            "serve", "--backend", engine.url, "--host", LOOPBACK,
            "--gossip-port", str(own), "--gossip-peer", f"{LOOPBACK}:{peer}",
            "--gossip-preset", "local",
        ]  # fmt: skip
        replica = installed.start(args, tmp_path, port=http, ready_path="/ready", env=secret)
        procs.append(replica)
        replicas.append(replica)
    for replica in replicas:
        wait_until(
            partial(peer_alive, replica),
            f"replica on port {replica.port} to see its peer alive",
            timeout=60,
        )
    assert all(r.alive() for r in replicas)


@pytest.mark.integration
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 360)
def test_installed_demo_runs_to_the_end(installed: Installed) -> None:
    port = free_port()
    res = installed.run(installed.kvrouter, "demo", "--port", str(port), timeout=300)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert "round-robin" in res.stdout and "kv-aware" in res.stdout
    assert f"gateway http://127.0.0.1:{port} in front of" in res.stdout
