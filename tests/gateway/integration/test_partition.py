"""Three gossiping ``kvrouter serve`` replicas under load, one cut off from the other two, healed.

Each replica dials its peers through a loopback CONNECT proxy of its own (``connect_proxy``,
named by ``grpc_proxy``), so the test can cut replica a off from b and c while b and c still
talk, over the real gRPC transport: a's proxy drops every tunnel, b's and c's drop theirs to a.
Clients keep reaching all three (a partition between replicas, not between clients and them).
The network fails three ways (``CUTS``): packets dropped with the connections carrying on after
the heal, packets dropped with the connections dead ever after, connections reset.

Load the test can count exactly is held open: streams that decode for as long as the test
keeps them (slow ``engine-sim``s, engine metrics off so that every figure is the replicas'
own). Each replica's decision shows its view of the fleet's in-flight load per engine
(``/debug/route``), which must be what is really in flight: while cut, a counts its own and b
and c theirs (a's report expires, rather than pinning load it no longer vouches for); once
healed, each counts everyone's, once; when the streams close, zero everywhere. Prefixes
routed on either side of the cut reach the other side after the heal. No client request
fails meanwhile. Every wait is bounded in count and time and asserts no duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.gossip.clock import TEST_SKEW_ENV
from tests.gateway.integration.connect_proxy import ConnectProxy
from tests.support import Proc, ametric, eventually, free_port, running, start_kvrouter

pytestmark = pytest.mark.integration

MODEL = "sim-model"
SECRET = "partition-test-secret-0123456789"
TOKEN = "partition-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"
PEERS = "kvrouter_gossip_peers"
SYSTEM = " ".join(f"clause{i} answer in one short line" for i in range(60))
NAMES = ("a", "b", "c")
# Streams held open through each replica: unequal, so a figure counted twice or lost shows.
HELD = {"a": 2, "b": 3, "c": 1}
# Long enough for a's load report to expire at b and c and for them to declare it dead and
# forget it (the local preset: load TTL 1 s, dead members forgotten after 3 s).
CUT_SECONDS = 4.0

# How the network fails, as ``connect_proxy`` does it: packets dropped and the connections
# carrying on after the heal, packets dropped and the connections dead ever after, or the
# connections reset and refused.
CUTS: dict[str, Callable[..., None]] = {
    "dropped": ConnectProxy.cut,
    "black-hole": functools.partial(ConnectProxy.cut, black_hole=True),
    "reset": ConnectProxy.reset,
}

CONFIG = """
engine_metrics: {{enabled: false}}
gossip:
  enabled: true
  port: {port}
  node_id: {name}
  peers: [{peers}]
  preset: local
"""


def chat(system: str, user: str, *, stream: bool = False, max_tokens: int = 2) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@dataclass
class Fleet:
    http: aiohttp.ClientSession
    replicas: dict[str, Proc]
    proxies: dict[str, ConnectProxy]
    gossip: dict[str, str]

    async def route(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.replicas[name].url}/debug/route"
        async with self.http.post(url, json=body, headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            got: dict[str, Any] = await r.json()
            return got

    async def inflight(self, name: str) -> int:
        """The fleet's in-flight requests over every engine, as replica ``name`` sees them."""
        got = await self.route(name, chat("view " + SYSTEM, "probe"))
        return sum(int(c["inflight_requests"]) for c in got["candidates"])

    async def overlap(self, name: str, body: dict[str, Any]) -> dict[str, int]:
        got = await self.route(name, body)
        return {c["engine"]: int(c["overlap_blocks"]) for c in got["candidates"]}

    async def alive(self, name: str) -> float:
        return await ametric(self.replicas[name], PEERS, state="alive")

    def cut(self, name: str, how: str) -> None:
        """Cut replica ``name`` off from every other replica, both ways, ``how`` (a mode of
        ``CUTS``)."""
        for other in NAMES:
            targets = () if other == name else (self.gossip[name],)
            CUTS[how](self.proxies[other], *targets)

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()


@contextlib.asynccontextmanager
async def fleet_of_three(
    tmp: Path, skews: dict[str, float] | None = None, alive: int = 2
) -> AsyncIterator[Fleet]:
    """Three replicas (with their gossip clocks off by ``skews`` seconds), started once each
    sees ``alive`` others alive."""
    proxies = {n: await ConnectProxy(n).start() for n in NAMES}
    ports = {n: free_port() for n in NAMES}
    gossip = {n: f"127.0.0.1:{p}" for n, p in ports.items()}
    try:
        with running([]) as procs:
            engine_args = ["engine-sim", "--decode-tokens-per-s", "40", "--prefill-tokens-per-s"]
            engines = [
                await asyncio.to_thread(start_kvrouter, [*engine_args, "200000"], tmp)
                for _ in range(2)
            ]
            procs.extend(engines)
            replicas: dict[str, Proc] = {}
            for name in NAMES:
                config = tmp / f"{name}.yaml"
                peers = ", ".join(f'"{gossip[o]}"' for o in NAMES if o != name)
                config.write_text(CONFIG.format(port=ports[name], name=name, peers=peers))
                args = ["serve", "--host", "127.0.0.1", "--log-level", "warning"]
                args += ["--config", str(config)]
                for e in engines:
                    args += ["--backend", e.url + "/"]
                env = {
                    "KVROUTER_GOSSIP_SECRET": SECRET,
                    "KVROUTER_ADMIN_TOKEN": TOKEN,
                    "grpc_proxy": proxies[name].url,
                    # Set, so that no no_proxy inherited from the machine bypasses the proxy.
                    "no_grpc_proxy": "nothing.invalid",
                }
                if name in (skews or {}):
                    env[TEST_SKEW_ENV] = str((skews or {})[name])
                replicas[name] = await asyncio.to_thread(start_kvrouter, args, tmp, env=env)
                procs.append(replicas[name])
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                f = Fleet(http, replicas, proxies, gossip)
                await eventually(
                    lambda: all_alive(f, alive, tuple(set(NAMES) - set(skews or {}))), timeout=30
                )
                yield f
            for name, proc in replicas.items():
                assert proc.stop() == 0, name
                assert "Traceback" not in proc.log(), name
    finally:
        for proxy in proxies.values():
            await proxy.close()


async def all_alive(f: Fleet, alive: int, names: tuple[str, ...] = NAMES) -> bool:
    return all([await f.alive(n) == alive for n in names])


@dataclass
class Held:
    """Streams kept open through the replicas, each decoding until it is closed."""

    started: dict[str, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def open(self, f: Fleet, name: str, n: int) -> None:
        for i in range(n):
            first = asyncio.get_running_loop().create_future()
            body = chat(f"held {name} {i} " + SYSTEM, "go", stream=True, max_tokens=1_000_000)
            self.tasks.append(asyncio.create_task(self._hold(f, name, body, first)))
            async with asyncio.timeout(30):  # the stream's first bytes, or the test fails
                await first
            self.started[name] = self.started.get(name, 0) + 1

    @staticmethod
    async def _hold(f: Fleet, name: str, body: dict[str, Any], first: asyncio.Future[None]) -> None:
        url = f"{f.replicas[name].url}{CHAT}"
        try:
            async with f.http.post(url, json=body, timeout=aiohttp.ClientTimeout()) as r:
                assert r.status == 200, await r.text()
                async for _ in r.content.iter_any():
                    if not first.done():
                        first.set_result(None)
        except BaseException as e:
            if not first.done():
                first.set_exception(e)
            raise

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


@dataclass
class Load:
    """Clients sending short requests round-robin over every replica until stopped."""

    statuses: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, f: Fleet, clients: int, limit: int) -> None:
        async def client(c: int) -> None:
            while not self.stop.is_set() and len(self.statuses) < limit:
                i = len(self.statuses)
                proc = f.replicas[NAMES[i % len(NAMES)]]
                body = chat(f"tenant {i % 5} " + SYSTEM, f"client {c} turn {i}", stream=i % 2 == 0)
                try:
                    async with f.http.post(f"{proc.url}{CHAT}", json=body) as r:
                        data = await r.read()
                        ok = r.status == 200 and b'"error"' not in data
                        self.statuses.append(200 if ok else r.status)
                except aiohttp.ClientError:
                    self.statuses.append(599)

        await asyncio.gather(*(client(c) for c in range(clients)))


@pytest.mark.parametrize("how", list(CUTS))
async def test_replica_cut_off_and_healed_loses_no_request_counts_load_once(
    tmp_path: Path, how: str
) -> None:
    async with fleet_of_three(tmp_path) as f:
        held, load = Held(), Load()
        total = sum(HELD.values())
        try:
            for name, n in HELD.items():
                await held.open(f, name, n)

            async def everyone_counts(expected: dict[str, int]) -> None:
                for name in NAMES:
                    assert await f.inflight(name) == expected[name], (name, expected)

            await eventually(lambda: everyone_counts(dict.fromkeys(NAMES, total)), timeout=20)
            task = asyncio.create_task(load.run(f, clients=4, limit=5000))
            await eventually(lambda: len(load.statuses) >= 10 or task.done(), timeout=30)

            f.cut("a", how)
            await eventually(lambda: all_alive(f, 0, ("a",)), timeout=20)
            await eventually(lambda: all_alive(f, 1, ("b", "c")), timeout=20)
            # News made on each side of the cut, which the other side has not heard.
            lone = chat("routed by a while cut off " + SYSTEM, "first")
            majority = chat("routed by b during the cut " + SYSTEM, "first")
            for name, body in (("a", lone), ("b", majority)):
                async with f.http.post(f"{f.replicas[name].url}{CHAT}", json=body) as r:
                    assert r.status == 200, await r.text()
            apart = {"a": HELD["a"], "b": HELD["b"] + HELD["c"], "c": HELD["b"] + HELD["c"]}
            # Load is drained before the counts are read: the held streams are all that runs.
            load.stop.set()
            await task
            await eventually(lambda: everyone_counts(apart), timeout=20)
            assert set((await f.overlap("c", lone)).values()) == {0}
            await asyncio.sleep(CUT_SECONDS)  # the cut lasts: a's load and membership age out

            load.stop.clear()
            task = asyncio.create_task(load.run(f, clients=4, limit=5000))
            f.heal()
            await eventually(lambda: all_alive(f, 2), timeout=30)
            await eventually(lambda: len(load.statuses) >= 20 or task.done(), timeout=30)
            load.stop.set()
            await task
            await eventually(lambda: everyone_counts(dict.fromkeys(NAMES, total)), timeout=20)

            async def learned(name: str, body: dict[str, Any]) -> bool:
                return any(v > 0 for v in (await f.overlap(name, body)).values())

            for name, body in (("b", lone), ("c", lone), ("a", majority)):
                await eventually(lambda: learned(name, body), timeout=20)  # noqa: B023
        finally:
            load.stop.set()
            await held.close()
        assert len(load.statuses) >= 30
        assert set(load.statuses) == {200}, [s for s in load.statuses if s != 200]
        assert held.started == HELD
        # At rest every replica's view of the fleet, and its own counters, are back to zero.
        await eventually(lambda: everyone_counts(dict.fromkeys(NAMES, 0)), timeout=20)
        for name, proc in f.replicas.items():
            assert await ametric(proc, "kvrouter_backend_inflight_requests") == 0, name
        # The cut was real: every replica's gossip went through its proxy.
        assert all(p.tunnels_opened > 0 for p in f.proxies.values())


async def test_replica_minutes_off_refused_both_ways_each_log_names_the_other(
    tmp_path: Path,
) -> None:
    async with fleet_of_three(tmp_path, skews={"c": -300.0}, alive=1) as f:
        a, c = f.replicas["a"], f.replicas["c"]

        def said(proc: Proc, *words: str) -> bool:
            return any(all(w in line for w in words) for line in proc.log().splitlines())

        await eventually(lambda: said(a, "refusing c", "-300", "replay window"), timeout=20)
        await eventually(
            lambda: said(c, "a message from c was refused", "stale", "-300"), timeout=20
        )
        assert await ametric(a, "kvrouter_gossip_refused_total", reason="stale") > 0
        assert await f.alive("c") == 0
        # What c routes stays c's: a never hears of it.
        body = chat("routed by the replica with the wrong clock " + SYSTEM, "first")
        async with f.http.post(f"{c.url}{CHAT}", json=body) as r:
            assert r.status == 200, await r.text()
        assert any(v > 0 for v in (await f.overlap("c", body)).values())
        assert await all_alive(f, 1, ("a", "b"))
        assert set((await f.overlap("a", body)).values()) == {0}


async def test_replica_seconds_off_tolerated_joins_with_a_warning(tmp_path: Path) -> None:
    async with fleet_of_three(tmp_path, skews={"c": 12.0}) as f:
        await eventually(lambda: all_alive(f, 2), timeout=20)
        a = f.replicas["a"]
        await eventually(lambda: "c's clock is +12" in a.log() and "tolerated" in a.log())
        assert await ametric(a, "kvrouter_gossip_refused_total", reason="stale") == 0
