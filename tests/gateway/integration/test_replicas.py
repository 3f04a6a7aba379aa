"""Three ``kvrouter serve`` replicas gossiping on loopback, in front of two ``engine-sim``s.

Replica a is given its peers by flags, b by its config file, c by ``--gossip-dns`` (localhost
resolves to a). They run the ``local`` gossip preset, made for replicas on one host. Each
replica's ``/debug/route`` (admin) shows the overlap it believes every engine holds, which is
how a test sees what gossip brought. Every wait is bounded in count and time, nothing asserts
on durations, and every process is stopped at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.support import ROUTER_METRICS
from tests.support import (
    ROOT,
    Proc,
    ametric,
    eventually,
    free_port,
    http_json,
    metric,
    metric_in,
    metrics_text,
    running,
    start_kvrouter,
    wait_http,
    wait_until,
)

pytestmark = pytest.mark.integration

MODEL = "sim-model"
SECRET = "serve-gossip-test-secret-0123456789"
TOKEN = "gossip-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"KVROUTER_GOSSIP_SECRET": SECRET, "KVROUTER_ADMIN_TOKEN": TOKEN}
CHAT = "/v1/chat/completions"
# Several of the kv-aware policy's 512-character blocks.
SYSTEM = " ".join(f"rule{i} keep answers short and exact" for i in range(60))
PEERS = "kvrouter_gossip_peers"

CONFIG_B = """
gossip:
  enabled: true
  port: {port}
  peers: ["127.0.0.1:{seed}"]
  preset: local
"""


def chat(system: str, user: str = "hello") -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 3,
    }


@dataclass
class Replica:
    name: str
    args: list[str]
    port: int
    gossip_port: int
    env: dict[str, str]
    proc: Proc | None = None

    @property
    def live(self) -> Proc:
        assert self.proc is not None and self.proc.alive(), f"replica {self.name} is not running"
        return self.proc


@dataclass
class Fleet:
    tmp: Path
    procs: list[Proc]
    engines: list[Proc] = field(default_factory=list)
    replicas: dict[str, Replica] = field(default_factory=dict)

    def add(self, name: str, gossip: list[str], env: dict[str, str] = ENV) -> Replica:
        """A replica's command line (serve flags, backends, gossip flags); not started."""
        port = free_port()
        gport = free_port()
        args = ["serve", "--host", "127.0.0.1", "--log-level", "warning"]
        for e in self.engines:
            args += ["--backend", e.url + "/"]  # normalised: the engine's name is its URL
        args += [a.replace("{gport}", str(gport)) for a in gossip]  # its own gossip port
        r = self.replicas[name] = Replica(name, args, port, gport, env)
        return r

    def start(self, name: str) -> Proc:
        r = self.replicas[name]
        r.proc = start_kvrouter(r.args, self.tmp, port=r.port, env=r.env)
        self.procs.append(r.proc)
        return r.proc

    def kill(self, name: str) -> None:
        r = self.replicas[name]
        if r.proc is not None and r.proc.alive():
            r.proc.popen.kill()
            r.proc.popen.wait(10)

    def running(self, *names: str) -> list[Proc]:
        return [self.replicas[n].live for n in names]

    def engine_of(self, replica: str, body: dict[str, Any]) -> tuple[str, dict[str, int]]:
        """The engine ``replica`` would pick for ``body``, and each engine's overlap there."""
        got = http_json(f"{self.replicas[replica].live.url}/debug/route", body, ADMIN)
        return got["engine"], {c["engine"]: c["overlap_blocks"] for c in got["candidates"]}

    def all_see(self, alive: int, *names: str) -> bool:
        return all(metric(p, PEERS, state="alive") == alive for p in self.running(*names))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("gossip")
    with running([]) as procs:
        f = Fleet(tmp, procs)
        f.engines = [start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2)]
        procs.extend(f.engines)
        flags = ["--gossip-port", "{gport}", "--gossip-preset", "local"]
        a = f.add("a", flags)
        config = tmp / "b.yaml"
        b = f.add("b", ["--config", str(config)])
        config.write_text(CONFIG_B.format(port=b.gossip_port, seed=a.gossip_port))
        dns = f"localhost:{a.gossip_port}"  # localhost resolves to a's address
        f.add("c", [*flags, "--gossip-node-id", "replica-c", "--gossip-dns", dns])
        for name in "abc":
            f.start(name)
        wait_until(lambda: f.all_see(2, "a", "b", "c"), "three replicas alive to each other")
        yield f
        for r in f.replicas.values():
            if r.proc is not None and r.proc.alive():
                assert r.proc.stop() == 0  # SIGTERM: leave the fleet, drain, exit cleanly
                assert "Traceback" not in r.proc.log()


def ensure_running(fleet: Fleet, name: str) -> None:
    r = fleet.replicas[name]
    if r.proc is None or not r.proc.alive():
        fleet.start(name)
    wait_until(lambda: fleet.all_see(2, "a", "b", "c"), "three replicas alive to each other")


# -- one fleet, one index ---------------------------------------------------------------------


def test_prefix_routed_through_a_b_and_c_route_it_to_the_same_engine(fleet: Fleet) -> None:
    ensure_running(fleet, "c")
    body = chat("agreement " + SYSTEM)
    _, before = fleet.engine_of("b", body)
    assert set(before.values()) == {0}  # nobody has seen this prefix
    with urllib.request.urlopen(
        urllib.request.Request(
            f"{fleet.replicas['a'].live.url}{CHAT}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        ),
        timeout=10,
    ) as r:
        assert r.status == 200
    engine, overlap = fleet.engine_of("a", body)
    assert overlap[engine] > 0
    for name in "bc":
        wait_until(lambda: fleet.engine_of(name, body)[1][engine] > 0, f"{name} learns")  # noqa: B023
        assert fleet.engine_of(name, body)[0] == engine
    # And b really sends the conversation's next turn there, where the engine has it cached.
    stats_before = http_json(f"{engine}/stats")
    answer = http_json(f"{fleet.replicas['b'].live.url}{CHAT}", chat("agreement " + SYSTEM, "2nd"))
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert http_json(f"{engine}/stats")["requests"] == stats_before["requests"] + 1


def test_metrics_gossip_series_exported_and_in_the_contract(fleet: Fleet) -> None:
    text = metrics_text(fleet.replicas["a"].live)
    fams = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert metric_in(text, "kvrouter_gossip_rounds_total") > 0
    assert metric_in(text, "kvrouter_gossip_bytes_total", direction="in") > 0
    for result in ("published", "applied", "duplicate"):
        assert f'kvrouter_gossip_deltas_total{{result="{result}"}}' in text
    # Every series the router exports is in the list the dashboard is checked against.
    contract = {name.removesuffix("_total"): kind for name, kind in ROUTER_METRICS.items()}
    exported = {
        name: kind
        for name, kind in fams.items()
        # The text parser turns each counter's and histogram's *_created sample into a gauge.
        if name.startswith("kvrouter_") and not name.endswith("_created")
    }
    assert exported.items() <= contract.items(), set(exported.items()) - set(contract.items())


# -- failures ---------------------------------------------------------------------------------


@dataclass
class Load:
    results: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def drive(targets: list[Proc], load: Load, limit: int) -> None:
    """Four clients, round-robin over ``targets`` (a Service), until ``stop`` or ``limit``."""
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def worker(w: int) -> None:
            while not load.stop.is_set() and len(load.results) < limit:
                i = len(load.results)
                body = chat(f"tenant {i % 7} " + SYSTEM, f"worker {w} request {i}")
                body["stream"] = i % 2 == 0
                try:
                    async with http.post(f"{targets[i % len(targets)].url}{CHAT}", json=body) as r:
                        data = await r.read()
                        ok = r.status == 200 and b'"error"' not in data
                        load.results.append(200 if ok else r.status)
                except aiohttp.ClientError:
                    load.results.append(599)

        await asyncio.gather(*(worker(w) for w in range(4)))


async def test_replica_killed_under_load_survivors_mark_it_dead_no_request_fails(
    fleet: Fleet,
) -> None:
    ensure_running(fleet, "c")
    a, b = fleet.running("a", "b")
    load = Load()
    task = asyncio.create_task(drive([a, b], load, limit=2000))
    try:
        await eventually(lambda: len(load.results) >= 20 or task.done(), interval=0.01)
        fleet.kill("c")
        seen_dead: set[str] = set()

        async def the_survivors_declared_it_dead() -> bool:
            for name, proc in (("a", a), ("b", b)):
                if await ametric(proc, PEERS, state="dead") >= 1:
                    seen_dead.add(name)
            return seen_dead == {"a", "b"}

        await eventually(the_survivors_declared_it_dead, timeout=15)
        after = len(load.results)
        # The survivors go on serving once they know.
        await eventually(lambda: len(load.results) >= after + 20 or task.done(), interval=0.01)
    finally:
        load.stop.set()
        await task
    assert len(load.results) >= 40
    assert set(load.results) == {200}, [r for r in load.results if r != 200]
    # Nothing stays charged: the dead replica's reports are gone, the survivors' load is back
    # to zero, fleet-wide (the decision's own figures).
    body = chat("load check " + SYSTEM)

    def idle(name: str) -> bool:
        got = http_json(f"{fleet.replicas[name].live.url}/debug/route", body, ADMIN)
        return all(c["inflight_requests"] == 0 for c in got["candidates"])

    await eventually(lambda: idle("a") and idle("b"), timeout=20)  # fleet-wide load back to zero


def test_replica_restarted_catches_up_on_what_was_routed_while_it_was_down(
    fleet: Fleet,
) -> None:
    ensure_running(fleet, "c")
    fleet.kill("c")
    a = fleet.replicas["a"].live
    body = chat("while c was down " + SYSTEM)
    http_json(f"{a.url}{CHAT}", body)
    engine, overlap = fleet.engine_of("a", body)
    assert overlap[engine] > 0
    c = fleet.start("c")  # the same flags and ports
    wait_until(lambda: fleet.all_see(2, "a", "b", "c"), "the restarted replica alive again")
    wait_until(lambda: fleet.engine_of("c", body)[1][engine] > 0, "c catches up")
    assert fleet.engine_of("c", body)[0] == engine
    text = metrics_text(c)
    caught_up = metric_in(text, "kvrouter_gossip_deltas_total", result="applied") + metric_in(
        text, "kvrouter_gossip_snapshots_total", direction="received"
    )
    assert caught_up >= 1


# -- security ---------------------------------------------------------------------------------


def test_wrong_secret_replica_refused_never_alive(fleet: Fleet) -> None:
    ensure_running(fleet, "c")
    a = fleet.replicas["a"].live
    refused = metric(a, "kvrouter_gossip_refused_total", reason="mac")
    env = {**ENV, "KVROUTER_GOSSIP_SECRET": "not-the-fleet-secret-9876543210"}
    seed = f"127.0.0.1:{fleet.replicas['a'].gossip_port}"
    flags = ["--gossip-port", "{gport}", "--gossip-preset", "local", "--gossip-peer", seed]
    fleet.add("rogue", [*flags, "--gossip-node-id", "rogue"], env=env)
    rogue = fleet.start("rogue")
    try:
        wait_http(f"{rogue.url}/ready")  # its engines probed healthy, not only listening
        body = chat("rogue prefix " + SYSTEM)
        http_json(f"{rogue.url}{CHAT}", body)  # the rogue routes, and tries to tell
        alive_seen: set[float] = set()

        def refused_enough() -> bool:
            text = metrics_text(a)
            alive_seen.add(metric_in(text, PEERS, state="alive"))
            return metric_in(text, "kvrouter_gossip_refused_total", reason="mac") >= refused + 3

        wait_until(refused_enough, "a refusing the rogue's messages")
        # Never a member (a peer may be suspected for a moment on a loaded machine, so the
        # count can dip; it never reaches the rogue).
        assert max(alive_seen) <= 2, alive_seen
        wait_until(lambda: fleet.all_see(2, "a", "b", "c"), "the fleet as it was")
        assert metric(rogue, PEERS, state="alive") == 0
        assert metric(rogue, "kvrouter_gossip_call_failures_total") > 0
        for name in "abc":
            assert set(fleet.engine_of(name, body)[1].values()) == {0}
    finally:
        assert rogue.stop() == 0


def test_gossip_without_secret_or_tls_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVROUTER_GOSSIP_SECRET"}
    cmd = [sys.executable, "-m", "router.cli", "serve", "--backend", "http://127.0.0.1:9"]
    cmd += ["--host", "127.0.0.1", "--port", str(free_port()), "--gossip-port", str(free_port())]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert out.returncode == 2
    assert b"KVROUTER_GOSSIP_SECRET" in out.stderr and b"Traceback" not in out.stderr


def test_gossip_port_taken_exits_1_with_reason(fleet: Fleet) -> None:
    ensure_running(fleet, "c")
    taken = fleet.replicas["a"].gossip_port
    cmd = [sys.executable, "-m", "router.cli", "serve", "--backend", "http://127.0.0.1:9"]
    cmd += ["--host", "127.0.0.1", "--port", str(free_port()), "--gossip-port", str(taken)]
    out = subprocess.run(
        cmd, env={**os.environ, **ENV}, cwd=ROOT, capture_output=True, timeout=60, check=False
    )
    assert out.returncode == 1, out.stderr.decode()
    assert f"gossip cannot start: cannot listen on 127.0.0.1:{taken}".encode() in out.stderr
    # The fleet is unharmed: nothing took a share of a's port.
    wait_until(lambda: fleet.all_see(2, "a", "b", "c"), "the fleet as it was")
