"""The peers' disaggregating proxies as bench.pd_capture runs them, each in front of a
prefill and a decode engine given by URL.

- vLLM's NIXL/P2P toy proxy (``toy_proxy_server.py``, a file, run by an interpreter with
  fastapi, httpx and uvicorn; ``OPENAI_API_KEY`` left unset, as in vLLM's own tests);
- SGLang's mini load balancer (``mini_lb.py``, a file; the two names it imports from the
  sglang package, which needs a GPU stack to install, are given by stand-ins written here);
- SMG and sglang-router (``--pd-disaggregation``), installed packages.

``Peer`` says how one is started and where its fixtures go; ``wait_registered`` waits until
it is ready to route.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from router.commands.fleet import Proc, wait_ready
from router.hostport import LOOPBACK, free_port

# The prefill engine's bootstrap port as the SGLang proxies are told it: a fixed number, so
# the fixtures can carry it as is.
BOOTSTRAP_PORT = 8998
READY_SECONDS = 60.0


@dataclass(frozen=True)
class Peer:
    """One proxy: its protocol, its ``source`` line, the folder its fixtures go to, and its
    command line in front of two engines (``--host`` and ``--port`` follow)."""

    protocol: str
    source: str
    folder: str
    argv: Callable[[str, str], list[str]]
    ready_path: str
    env: dict[str, str] | None = None


def _host_port(url: str) -> tuple[str, str]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, port


def vllm_peer(python: str, proxy: Path, commit: str) -> Peer:
    def argv(prefill: str, decode: str) -> list[str]:
        (ph, pp), (dh, dp) = _host_port(prefill), _host_port(decode)
        return [
            python, str(proxy.resolve()), "--prefiller-hosts", ph, "--prefiller-ports", pp,
            "--decoder-hosts", dh, "--decoder-ports", dp,
        ]  # fmt: skip

    where = f"vllm-project/vllm@{commit}" if commit else "vllm-project/vllm"
    httpx = installed_version(python, "httpx")
    source = (
        f"vLLM toy_proxy_server.py (tests/v1/kv_connector/nixl_integration, {where}; httpx {httpx})"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return Peer("vllm", source, ".", argv, "/healthcheck", env)


def sglang_peer(python: str, package: str, module: str, folder: str) -> Peer:
    def argv(prefill: str, decode: str) -> list[str]:
        return [
            python, "-m", module, "--pd-disaggregation",
            "--prefill", prefill, str(BOOTSTRAP_PORT), "--decode", decode,
            "--policy", "round_robin", "--log-level", "warn",
            "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()),
        ]  # fmt: skip

    version = installed_version(python, package)
    return Peer(
        "sglang", f"{package} {version} ({module} --pd-disaggregation)", folder, argv, "/workers"
    )


# What SGLang's mini_lb.py imports from the sglang package, which needs a GPU stack to install:
# the registration request's model and the IPv6 bracketing of a host, as sglang defines them.
MINI_LB_STAND_INS = {
    "sglang/srt/utils.py": (
        "import ipaddress\n\n\n"
        "def maybe_wrap_ipv6_address(address):\n"
        "    try:\n"
        "        ipaddress.IPv6Address(address)\n"
        "        return f'[{address}]'\n"
        "    except ValueError:\n"
        "        return address\n"
    ),
    "sglang/srt/disaggregation/utils.py": (
        "from typing import Optional\n\nfrom pydantic import BaseModel\n\n\n"
        "class PDRegistryRequest(BaseModel):\n"
        "    mode: str\n"
        "    registry_url: str\n"
        "    bootstrap_port: Optional[int] = None\n"
    ),
}


def mini_lb_peer(python: str, mini_lb: Path, commit: str, scratch: Path) -> Peer:
    """SGLang's mini load balancer, run with stand-ins for the two names it imports."""
    for name, text in MINI_LB_STAND_INS.items():
        path = scratch / name
        for package in [*path.parents][: len(Path(name).parents) - 1]:
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
        path.write_text(text)

    def argv(prefill: str, decode: str) -> list[str]:
        return [
            python, str(mini_lb.resolve()), "--prefill", prefill, "--decode", decode,
            "--prefill-bootstrap-ports", str(BOOTSTRAP_PORT),
        ]  # fmt: skip

    where = f"sgl-project/sglang@{commit}" if commit else "sgl-project/sglang"
    aiohttp_version = installed_version(python, "aiohttp")
    source = (
        f"SGLang mini_lb.py (python/sglang/srt/disaggregation, {where}; aiohttp {aiohttp_version})"
    )
    env = {**os.environ, "PYTHONPATH": str(scratch)}
    return Peer("sglang", source, ".", argv, "/health", env)


def installed_version(python: str, package: str) -> str:
    """``package``'s version in ``python``'s environment."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True)
    return done.stdout.strip()


async def wait_registered(proxy: Proc, path: str) -> None:
    """Until ``GET path`` answers 200 and, for SGLang's gateways, lists both engines healthy."""
    await asyncio.to_thread(wait_ready, proxy.url + path, proc=proxy, timeout=READY_SECONDS)
    if path != "/workers":
        return
    deadline = time.monotonic() + READY_SECONDS
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(proxy.url + path) as r:
                workers = (await r.json()).get("workers", [])
            if sum(1 for w in workers if w.get("is_healthy")) >= 2:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{proxy.name}: both engines not healthy after {READY_SECONDS} s")
