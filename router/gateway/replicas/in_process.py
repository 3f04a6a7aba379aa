"""Many router replicas in one process: real nodes, indexes and load books, in-memory network.

For tests and benches. Every replica is what the gateway would run (a ``BlockIndex``, a
``LoadBook``, an ``IndexDelegate`` and a ``GossipNode``) minus the HTTP; they talk over an
``InMemoryNetwork`` on one clock (virtual by default) and find each other through a fake DNS
name that resolves to every replica currently listening, like a Kubernetes headless Service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.load import LoadBook
from router.gateway.replicas.delegate import IndexDelegate, run_origin
from router.gossip.clock import Clock, ManualClock
from router.gossip.config import LOCAL, GossipConfig, Tuning
from router.gossip.node import GossipNode
from router.gossip.transport import NO_FAULTS, Faults, InMemoryNetwork

DNS_NAME = "kvrouter-gossip.fleet"
PORT = 7946
SECRET = b"fleet-shared-secret-0123456789"


@dataclass
class Replica:
    """One in-process router replica."""

    name: str
    address: str
    index: BlockIndex
    loads: LoadBook
    bridge: IndexDelegate
    node: GossipNode

    def record(self, engine: str, keys: Sequence[int], now: float = 0.0) -> Delta:
        """Route a request's blocks to ``engine`` here and queue the delta for gossip."""
        self.index.predict(engine, keys, now)  # as an attempt does, confirmed by its answer
        delta = self.index.confirm(engine, keys, now)
        self.bridge.queue(delta)
        return delta

    def contents(self) -> dict[str, frozenset[int]]:
        """Each engine's block keys (engines holding nothing omitted)."""
        idx = self.index
        return {e: frozenset(idx.export_keys(e)) for e in idx.engines if idx.blocks(e)}


class Fleet:
    """Replicas named r0, r1, ... on one in-memory network and one clock."""

    def __init__(
        self,
        *,
        tuning: Tuning = LOCAL,
        faults: Faults = NO_FAULTS,
        clock: Clock | None = None,
        seed: int = 0,
        secret: bytes = SECRET,
        capacity_blocks: int = 1 << 20,
    ) -> None:
        self.clock: Clock = clock or ManualClock()
        self.tuning = tuning
        self.secret = secret
        self.seed = seed
        self.limits = IndexLimits(engine_capacity_blocks=capacity_blocks)
        self.network = InMemoryNetwork(
            self.clock, faults, seed, tuning.max_message_bytes, tuning.max_serving
        )
        self.replicas: dict[str, Replica] = {}
        self._started = 0

    async def resolve(self, host: str, port: int) -> list[str]:
        """The fake headless Service: every replica running now (like ready pods)."""
        if host != DNS_NAME:
            raise OSError(f"unknown host {host}")
        return [r.address for r in self.replicas.values() if r.node.running]

    def build(
        self, name: str, *, secret: bytes | None = None, clock: Clock | None = None
    ) -> Replica:
        """A replica not started yet (a restart reuses the name and address), on the fleet's
        clock or its own (one whose wall time is off, ``SkewedClock``)."""
        clock = clock or self.clock
        if name in self.replicas:
            address = self.replicas[name].address
        else:
            n = len(self.replicas) + 1
            address = f"10.0.{n // 250}.{n % 250}:{PORT}"
        config = GossipConfig(
            node_id=name,
            bind=address,
            dns_name=f"{DNS_NAME}:{PORT}",
            secret=secret or self.secret,
            tuning=self.tuning,
        )
        index = BlockIndex(self.limits, origin=run_origin(name))
        loads = LoadBook()
        bridge = IndexDelegate(index, loads, now=clock.now, wall=clock.wall)
        self._started += 1
        node = GossipNode(
            config,
            bridge,
            self.network.transport(address),
            clock=clock,
            resolver=self.resolve,
            seed=self.seed * 7919 + self._started,
        )
        return Replica(name, address, index, loads, bridge, node)

    async def add(
        self, name: str | None = None, *, secret: bytes | None = None, clock: Clock | None = None
    ) -> Replica:
        """Start a replica (a new one, or a stopped one again) and let it join."""
        name = name or f"r{len(self.replicas)}"
        replica = self.build(name, secret=secret, clock=clock)
        self.replicas[name] = replica
        await self._drive(replica.node.start())
        return replica

    async def start(self, count: int) -> list[Replica]:
        """Start ``count`` new replicas, one after another."""
        return [await self.add() for _ in range(count)]

    async def stop(self, name: str, leave: bool = False) -> None:
        """Stop one replica (a crash unless ``leave``); it stays listed, not listening."""
        await self._drive(self.replicas[name].node.stop(leave=leave))

    async def close(self) -> None:
        """Stop every replica."""
        for r in self.replicas.values():
            await self._drive(r.node.stop(leave=False))

    async def _drive(self, work: Coroutine[Any, Any, None], step: float = 0.01) -> None:
        """Await ``work``, moving the virtual clock meanwhile (its timeouts need time to pass)."""
        if not isinstance(self.clock, ManualClock):
            await work
            return
        task = asyncio.create_task(work)
        while not task.done():
            await self.clock.advance(step)
        await task

    def running(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.node.running]

    async def settle(self, done: Callable[[], bool], limit: float, step: float = 0.01) -> bool:
        """Advance the virtual clock until ``done()`` or ``limit`` seconds; whether done."""
        assert isinstance(self.clock, ManualClock), "settle needs the virtual clock"
        return await self.clock.run_until(done, step, limit)
