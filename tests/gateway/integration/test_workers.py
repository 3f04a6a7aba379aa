"""``kvrouter serve --workers 2`` in front of two ``engine-sim --fast``, on loopback.

The workers share the HTTP port (SO_REUSEPORT), so each fresh connection reaches one of them,
chosen by the kernel; the tests use fresh connections (urllib opens one per request) and tell
the workers apart by the gossip origins their ``/metrics`` report. Every wait is bounded, no
test asserts on durations, and every process is stopped at the end.
"""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.cli import build_parser
from router.commands.serve import config_from_args
from router.core.fields import ConfigError
from router.gateway.config.serving import DrainSettings
from router.gateway.config.settings import Config
from router.gateway.replicas.node_config import worker_configs
from router.gateway.runtime.workers import STOP_MARGIN_SECONDS, supervise
from router.gossip import PRESETS
from tests.support import Proc, http_json, running, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

MODEL = "sim-model"
TOKEN = "workers-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"
SYSTEM = " ".join(f"rule{i} keep answers short and exact" for i in range(60))
LAG = "kvrouter_gossip_convergence_lag_seconds"


def samples(proc: Proc, name: str) -> list[tuple[dict[str, str], float]]:
    """``name``'s samples from one scrape (one worker: a fresh connection)."""
    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        (dict(s.labels), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def chat(system: str, user: str = "hello") -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 3,
    }


def workers_of(pid: int) -> list[int]:
    """The worker processes of the ``serve`` process ``pid`` (its spawned children)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            out.append(int(entry.name))
    return sorted(out)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Still there, or a zombie nobody has reaped yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def alive_peers_everywhere(router: Proc, scrapes: int = 20) -> bool:
    """``scrapes`` fresh-connection scrapes in a row each show one alive gossip peer."""
    for _ in range(scrapes):
        got = dict((labels["state"], v) for labels, v in samples(router, "kvrouter_gossip_peers"))
        if got.get("alive") != 1:
            return False
    return True


def start_workers(tmp: Path, engines: list[Proc]) -> Proc:
    args = ["serve", "--host", "127.0.0.1", "--workers", "2", "--log-level", "warning"]
    for e in engines:
        args += ["--backend", e.url]
    router = start_kvrouter(args, tmp, ready_path="/ready", env={"KVROUTER_ADMIN_TOKEN": TOKEN})
    wait_until(lambda: len(workers_of(router.popen.pid)) == 2, "two worker processes")
    wait_until(lambda: alive_peers_everywhere(router), "each worker sees the other alive")
    return router


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    tmp = tmp_path_factory.mktemp("workers-engines")
    with running([]) as procs:
        procs.extend(start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2))
        yield procs


@pytest.fixture(scope="module")
def router(engines: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("workers")
    with running([]) as procs:
        r = start_workers(tmp, engines)
        procs.append(r)
        yield r
        assert r.stop() == 0
        assert "Traceback" not in r.log()


def test_requests_succeed_and_both_workers_serve(router: Proc) -> None:
    # Each worker spreads the blocks it records under its own gossip origin, which the other
    # worker's /metrics lists: two origins across scrapes means both workers routed requests
    # and both answered scrapes.
    origins: set[str] = set()
    for i in range(200):
        answer = http_json(f"{router.url}{CHAT}", chat(f"conversation {i} " + SYSTEM))
        assert answer["choices"][0]["message"]["content"]
        origins |= {labels["origin"] for labels, _ in samples(router, LAG)}
        if len(origins) == 2 and i >= 10:
            break
    assert len(origins) == 2, origins


def test_prefix_routed_through_one_worker_goes_to_the_same_engine_through_the_other(
    router: Proc, engines: list[Proc]
) -> None:
    body = chat("agreement " + SYSTEM)
    first = http_json(f"{router.url}{CHAT}", body)
    assert first["choices"][0]["message"]["content"]

    def route() -> tuple[str, int]:
        got = http_json(f"{router.url}/debug/route", body, ADMIN)
        overlap = {c["engine"]: c["overlap_blocks"] for c in got["candidates"]}
        return got["engine"], overlap[got["engine"]]

    holders: list[str] = []

    def learnt_somewhere() -> bool:
        engine, overlap = route()
        if overlap > 0:
            holders.append(engine)
        return bool(holders)

    wait_until(learnt_somewhere, "a worker that knows the prefix")
    engine = holders[0]

    def agree() -> bool:
        # 30 fresh connections in a row (both workers, but for a 2**-29 chance) pick the engine
        # holding the prefix: the worker that did not route it learnt it by gossip.
        for _ in range(30):
            picked, overlap = route()
            if picked != engine or overlap == 0:
                return False
        return True

    wait_until(agree, "both workers agree on the engine holding the prefix")
    before = http_json(f"{engine}/stats")["requests"]
    for _ in range(6):
        again = http_json(f"{router.url}{CHAT}", chat("agreement " + SYSTEM, "next turn"))
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert http_json(f"{engine}/stats")["requests"] == before + 6


def test_sigterm_to_the_parent_stops_every_worker(engines: list[Proc], tmp_path: Path) -> None:
    with running([]) as procs:
        r = start_workers(tmp_path, engines)
        procs.append(r)
        children = workers_of(r.popen.pid)
        assert r.stop(signal.SIGTERM) == 0
        wait_until(lambda: all(gone(pid) for pid in children), "every worker gone")
        assert "Traceback" not in r.log()


def test_a_worker_dying_stops_the_others_and_the_parent(
    engines: list[Proc], tmp_path: Path
) -> None:
    with running([]) as procs:
        r = start_workers(tmp_path, engines)
        procs.append(r)
        children = workers_of(r.popen.pid)
        os.kill(children[0], signal.SIGKILL)
        # The supervisor kills a sibling that has not drained within its grace and a margin,
        # so the parent's exit is bounded by that, not by how quickly the sibling shuts down.
        bound = DrainSettings().grace_seconds + STOP_MARGIN_SECONDS + 15
        try:
            wait_until(lambda: not r.alive(), "the parent exits", timeout=bound)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{r.log()}") from None
        assert r.popen.returncode != 0
        wait_until(lambda: all(gone(pid) for pid in children), "every worker gone")


# -- each worker's gossip settings (no processes) ---------------------------------------------

SECRET = "workers-test-secret-0123456789"


def config(*flags: str) -> Config:
    args = build_parser("serve").parse_args(
        ["serve", "--backend", "http://127.0.0.1:9", "--host", "127.0.0.1", *flags]
    )
    return config_from_args(args)


def test_private_fleet_on_loopback_with_a_fresh_secret_per_run() -> None:
    cfg = config("--port", "8000")
    one, two = worker_configs(cfg, 2, {}), worker_configs(cfg, 2, {})
    assert len(one) == 2
    for g in one:
        assert g.bind.startswith("127.0.0.1:") and g.advertise == g.bind
        assert g.tuning == PRESETS["local"]
        assert g.secret and len(g.secret) >= 16 and g.tls is None
    assert one[0].seeds == (one[1].bind,) and one[1].seeds == (one[0].bind,)
    assert one[0].node_id != one[1].node_id
    assert one[0].secret == one[1].secret != two[0].secret
    # The user's secret, when set, is the one used.
    mine = worker_configs(cfg, 2, {"KVROUTER_GOSSIP_SECRET": SECRET})
    assert {g.secret for g in mine} == {SECRET.encode()}


def test_external_fleet_worker_i_gossips_on_port_plus_i_and_seeds_with_its_siblings() -> None:
    cfg = config(
        "--gossip-port", "7946", "--gossip-peer", "10.0.0.9:7946", "--gossip-node-id", "pod-a"
    )
    got = worker_configs(cfg, 3, {"KVROUTER_GOSSIP_SECRET": SECRET})
    assert [g.bind for g in got] == ["127.0.0.1:7946", "127.0.0.1:7947", "127.0.0.1:7948"]
    assert [g.node_id for g in got] == ["pod-a-w0", "pod-a-w1", "pod-a-w2"]
    assert got[1].seeds == ("10.0.0.9:7946", "127.0.0.1:7946", "127.0.0.1:7948")
    assert all(g.secret == SECRET.encode() and g.tuning == PRESETS["lan"] for g in got)
    with pytest.raises(ConfigError):
        worker_configs(cfg, 3, {})  # an external fleet needs the user's secret or TLS


def test_workers_need_a_fixed_port_and_a_positive_count() -> None:
    with pytest.raises(ConfigError):
        supervise(config("--port", "0"), 2, "warning")
    with pytest.raises(ConfigError):
        supervise(config("--port", "8000"), 0, "warning")
