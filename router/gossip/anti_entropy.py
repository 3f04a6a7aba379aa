"""Anti-entropy: the periodic push-pull that repairs what rumours missed, and snapshot catch-up.

Rumours spread news fast but may lose some; anti-entropy makes two nodes agree in full. Every
``push_pull_interval`` the node exchanges every member it knows and its digest (per origin, the
delta seq held up to and the newest load version) with one random live peer; each side sends
what the other's digest lacks. The same round tries one member declared dead: it may only have
been cut off, and the exchange tells it so and repairs both sides. Joining is a push-pull with
whoever answers at an address.

A peer that a repair cannot catch up (the deltas it lacks are no longer all retained, or do not
fit one message) is advised to fetch a snapshot; a node that passed over deltas (more came past
a gap than it keeps waiting) fetches one too, from their origin when it is alive (it holds its
own blocks). A snapshot comes in chunks, one fetch at a time and at most once per
``snapshot_cooldown``; the serving side keeps bounded sessions (``router.gossip.snapshot``).

``AntiEntropy`` decides and sequences these exchanges; what they merge is ``NodeState``'s
(state.py), and the calls and the tasks that carry them are the node's (``GossipNode._exchange``,
``GossipNode._spawn``), so a stop cancels them with everything else.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from router.gossip.clock import Clock
from router.gossip.delegate import Delegate
from router.gossip.envelope import body_of
from router.gossip.membership import State
from router.gossip.snapshot import SnapshotSessions
from router.gossip.state import NodeState
from router.gossip.stats import Counters
from router.gossip.wire import pb

log = logging.getLogger(__name__)

# A snapshot may not claim more chunks than this (64 GiB at the default chunk size).
MAX_SNAPSHOT_CHUNKS = 65_536


class Exchange(Protocol):
    """One authenticated exchange with a member (``GossipNode._exchange``): the reply frame,
    or None on any failure or a nack."""

    def __call__(
        self, address: str, node_id: str, timeout: float | None = None, **body: Any
    ) -> Awaitable[pb.Frame | None]: ...


class Call(Protocol):
    """An exchange, for the reply's body message or None (``GossipNode._call``)."""

    def __call__(
        self, address: str, node_id: str, timeout: float | None = None, **body: Any
    ) -> Awaitable[Any]: ...


# Runs a coroutine as a task the node owns, at most one per key (``GossipNode._spawn``).
Spawn = Callable[[str, Coroutine[Any, Any, None]], bool]


class AntiEntropy:
    """One node's push-pull rounds and snapshot catch-up, both sides of each exchange."""

    def __init__(
        self,
        state: NodeState,
        delegate: Delegate,
        clock: Clock,
        counters: Counters,
        rng: random.Random,
        *,
        exchange: Exchange,
        call: Call,
        spawn: Spawn,
    ) -> None:
        t = state.tuning
        self.node_id = state.node_id
        self.tuning = t
        self._state = state
        self._delegate = delegate
        self._clock = clock
        self._counters = counters
        self._rng = rng
        self._exchange = exchange
        self._call = call
        self._spawn = spawn
        self._sessions = SnapshotSessions(t.snapshot_sessions, t.snapshot_session_ttl)
        self._snapshot_at = -math.inf
        self._catching_up = False

    # -- asking --------------------------------------------------------------------------------

    async def round(self) -> None:
        """One push-pull round: with one random live peer, and a try at one member declared dead."""
        table = self._state.members
        dead = table.peers(State.DEAD)
        if dead:
            # As memberlist gossips to the dead: a member declared dead may only have been cut
            # off. Once the network heals, this exchange tells it so (it refutes) and repairs
            # both sides, without waiting for the rejoin loop; the dead are tried only until
            # they are forgotten (dead_reclaim).
            peer = self._rng.choice(dead)
            self._spawn(f"dead:{peer.address}", self._revive(peer.address, peer.id))
        peers = table.peers(State.ALIVE)
        if peers:
            peer = self._rng.choice(peers)
            await self.push_pull(peer.address, peer.id)

    async def _revive(self, address: str, node_id: str) -> None:
        await self.push_pull(address, node_id)

    async def push_pull(self, address: str, node_id: str = "") -> bool:
        """Anti-entropy with member ``node_id``, or with whoever answers at ``address``."""
        frame = await self._exchange(address, node_id, push_pull=self._state.push_pull())
        reply = None if frame is None else body_of(frame)
        if frame is None or not isinstance(reply, pb.PushPullReply):
            return False
        # A first contact learns the peer's id from its (authenticated) reply: what follows
        # is for that node only.
        peer_id = frame.sender
        updates = self._state.apply_push_pull_reply(reply, self._clock.now(), self._clock.wall())
        if updates is not None:
            await self._call(address, peer_id, updates=updates)
        if reply.snapshot_advised:
            self._catch_up(address, peer_id)
        self.repair_skipped(address, peer_id)
        return True

    def repair_skipped(self, address: str, node_id: str) -> None:
        """When deltas were passed over, a snapshot: from their origin's node when it is alive
        (it holds its own blocks; delegates name origins NODE/RUN), else from ``node_id``."""
        skipped = self._state.deltas.skipped
        if not skipped:
            return
        for origin in skipped:
            member = self._state.members.get(origin.rpartition("/")[0] or origin)
            if member is not None and member.state is State.ALIVE and member.id != self.node_id:
                address, node_id = member.address, member.id
                break
        self._catch_up(address, node_id)

    def _catch_up(self, address: str, node_id: str) -> None:
        now = self._clock.now()
        if self._catching_up or now - self._snapshot_at < self.tuning.snapshot_cooldown:
            return
        if self._state.deltas.skipped:
            log.info(
                "gossip: %s missed deltas of %d origin(s) (more came past a gap than it keeps "
                "waiting); fetching a snapshot from %s",
                self.node_id,
                len(self._state.deltas.skipped),
                node_id or address,
            )
        self._snapshot_at = now
        self._spawn(f"snapshot:{address}", self._fetch_snapshot(address, node_id))

    async def _fetch_snapshot(self, address: str, node_id: str) -> None:
        self._catching_up = True
        try:
            timeout = self.tuning.snapshot_timeout
            first = await self._call(
                address, node_id, timeout, snapshot_request=pb.SnapshotRequest()
            )
            if not isinstance(first, pb.SnapshotChunk) or first.chunks > MAX_SNAPSHOT_CHUNKS:
                return
            self._delegate.restore_blocks(first.engines)
            for i in range(1, first.chunks):
                req = pb.SnapshotRequest(snapshot_id=first.snapshot_id, chunk=i)
                chunk = await self._call(address, node_id, timeout, snapshot_request=req)
                if not isinstance(chunk, pb.SnapshotChunk) or chunk.chunk != i:
                    return
                self._delegate.restore_blocks(chunk.engines)
            self._state.apply_snapshot(first, self._clock.now())
            self._counters.snapshots_received += 1
        finally:
            self._catching_up = False

    # -- answering -----------------------------------------------------------------------------

    async def on_push_pull(self, req: pb.PushPull) -> tuple[str, Any]:
        """A peer's push-pull: merge its members; reply with ours and what its digest lacks."""
        return "push_pull_reply", self._state.answer_push_pull(req, self._clock.now())

    async def on_snapshot_request(self, req: pb.SnapshotRequest) -> tuple[str, Any]:
        """A snapshot's next chunk, or chunk 0 of a new one while sessions have room."""
        now = self._clock.now()
        if req.snapshot_id:
            chunk = self._sessions.chunk(req.snapshot_id, req.chunk, now)
            if chunk is None:
                return "nack", pb.Nack(reason="snapshot unknown or expired")
            return "snapshot_chunk", chunk
        if not self._sessions.has_room(now):
            return "nack", pb.Nack(reason="busy: too many snapshots in progress")
        covers = self._state.digest()
        loads = list(self._state.loads.reports())
        parts: list[list[pb.EngineBlocks]] = []
        for part in self._delegate.export_blocks(self.tuning.snapshot_chunk_bytes):
            parts.append(part)
            # Copying a large index takes a while: let other work run between chunks.
            await asyncio.sleep(0)
        self._counters.snapshots_sent += 1
        return "snapshot_chunk", self._sessions.open(covers, loads, parts, self._clock.now())
