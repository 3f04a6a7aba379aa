"""A gossip node: membership, failure detection, dissemination and anti-entropy for one replica.

The node owns four loops, all started by ``start`` and cancelled by ``stop``:

- gossip round (every ``gossip_interval``): hand local deltas and load to the queues, then
  send Rumours (membership, load reports, offers of delta ids) to ``fanout`` random peers and
  push the delta bodies each peer asks for;
- probe (every ``probe_interval``): SWIM ping, indirect ping, suspect; expire suspicions,
  forget the long dead, drop load reports past their TTL;
- push-pull (every ``push_pull_interval``): exchange membership and digests with one random
  peer and repair both sides; a peer too far behind is advised to fetch a snapshot;
- rejoin (every ``rejoin_interval``): resolve seeds and the DNS name, push-pull with
  addresses no live member has.

Every exchange it starts is bounded by a timeout and owned (cancelled on stop); a slow peer
holds at most one of them at a time. What a delta or a load figure means is the delegate's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from router.core.fields import ConfigError
from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.broadcast import TransmitQueue
from router.gossip.clock import Clock, SystemClock
from router.gossip.config import GossipConfig, split_hostport
from router.gossip.delegate import Delegate
from router.gossip.discovery import Discovery, Resolver, system_resolver
from router.gossip.envelope import EnvelopeCodec
from router.gossip.membership import Change, Member, MemberTable, State
from router.gossip.snapshot import SnapshotSessions
from router.gossip.stats import Counters, GossipStats, copy_counters
from router.gossip.store import DeltaStore, LoadStore
from router.gossip.transport import Refused, Transport, TransportError
from router.gossip.wire import (
    digest_map,
    group_ids,
    member_from_pb,
    member_to_pb,
    pb,
    to_digest,
)

log = logging.getLogger(__name__)

# Membership rumours piggybacked on a ping, an ack or a reply: a handful, not a round's worth.
PIGGYBACK_BYTES = 2048
# Addresses contacted per rejoin tick, so a DNS name with many stale entries stays cheap.
JOIN_BATCH = 8
# A snapshot may not claim more chunks than this (64 GiB at the default chunk size).
MAX_SNAPSHOT_CHUNKS = 65_536

BodyHandler = Callable[[Any], Awaitable[tuple[str, Any]]]


class GossipNode:
    """One replica's gossip endpoint; ``start``/``stop`` own everything it runs."""

    def __init__(
        self,
        config: GossipConfig,
        delegate: Delegate,
        transport: Transport,
        *,
        clock: Clock | None = None,
        resolver: Resolver | None = None,
        seed: int | None = None,
    ) -> None:
        t = config.tuning
        self.config = config
        self.tuning = t
        self.node_id = config.node_id
        self.address = ""
        self._delegate = delegate
        self._transport = transport
        self._clock: Clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._discovery = Discovery(config.seeds, config.dns_target, resolver or system_resolver)
        self._counters = Counters()
        self._envelopes = EnvelopeCodec(
            self.node_id,
            Sealer(config.secret),
            ReplayGuard.create(t.replay_window, t.replay_entries),
            t.max_message_bytes,
            self._counters,
        )
        self._table: MemberTable | None = None
        self._deltas = DeltaStore(t.retained_bytes, t.retained_per_origin, t.max_origins)
        self._loads = LoadStore(t.max_members)
        self._member_q: TransmitQueue[str, pb.Member] = TransmitQueue(t.max_members)
        self._load_q: TransmitQueue[str, pb.LoadReport] = TransmitQueue(t.max_members)
        self._offer_q: TransmitQueue[tuple[str, int], tuple[str, int]] = TransmitQueue(
            t.queue_items
        )
        # Delta ids asked of some peer, until when: not asked again of others meanwhile.
        self._wanted: dict[tuple[str, int], float] = {}
        self._sessions = SnapshotSessions(t.snapshot_sessions, t.snapshot_session_ttl)
        self._snapshot_at = -math.inf
        self._catching_up = False
        self._load_version = 0
        self._load_sent: list[pb.EngineLoad] | None = None
        self._load_sent_at = -math.inf
        self._loops: list[asyncio.Task[None]] = []
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self._handlers: dict[str, BodyHandler] = {
            "ping": self._on_ping,
            "indirect_ping": self._on_indirect_ping,
            "rumours": self._on_rumours,
            "updates": self._on_updates,
            "push_pull": self._on_push_pull,
            "snapshot_request": self._on_snapshot_request,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen and start the loops; joining the seeds and DNS peers begins at once."""
        if self._running:
            raise RuntimeError(f"gossip node {self.node_id} already started")
        bound = await self._transport.start(self._handle)
        self.address = self.config.advertise or bound
        host = split_hostport(self.address, "advertise")[0]
        if host in ("0.0.0.0", "::", ""):
            await self._transport.stop()
            raise ConfigError(f"gossip bound {bound!r} on a wildcard: set advertise")
        now = self._clock.now()
        self._table = MemberTable(self.node_id, self.address, now, self.tuning.max_members)
        self._member_q.push(self.node_id, member_to_pb(self._table.local), 64)
        self._load_version = int(self._clock.wall() * 1000)
        self._running = True
        t = self.tuning
        # Joining runs in the background (as the rejoin loop's first step), so that start
        # never waits on unreachable seeds; ``join`` is there for callers who want to wait.
        self._loops = [
            self._loop("rejoin", t.rejoin_interval, self._rejoin, phase=0.0),
            self._loop("gossip", t.gossip_interval, self._round),
            self._loop("probe", t.probe_interval, self._probe),
            self._loop("push-pull", t.push_pull_interval, self._push_pull_random),
        ]

    async def stop(self, leave: bool = True) -> None:
        """Announce leaving (when ``leave``), cancel every task, close the transport."""
        if not self._running:
            return
        if leave:
            await self._leave()
        self._running = False
        tasks = [*self._loops, *self._inflight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops.clear()
        self._inflight.clear()
        await self._transport.stop()

    async def join(self, addresses: Iterable[str] | None = None) -> int:
        """Push-pull with ``addresses`` (default: what seeds and DNS give); how many answered."""
        if addresses is None:
            addresses = await self._discovery.addresses()
        targets = [a for a in dict.fromkeys(addresses) if a != self.address][: JOIN_BATCH * 4]
        results = await asyncio.gather(*(self._push_pull(a) for a in targets))
        return sum(results)

    # -- public views --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Between ``start`` and ``stop``."""
        return self._running

    def members(self) -> list[Member]:
        """Every member this node knows, itself included."""
        return self._members().all()

    def stats(self) -> GossipStats:
        """Counters and gauges right now."""
        table = self._table
        c = copy_counters(self._counters)
        c.queue_dropped = self._member_q.dropped + self._load_q.dropped + self._offer_q.dropped
        return GossipStats(
            node_id=self.node_id,
            counters=c,
            peers=table.counts() if table else {s.name.lower(): 0 for s in State},
            convergence_lag=dict(self._deltas.lag),
            queued_rumours=len(self._member_q) + len(self._load_q) + len(self._offer_q),
            retained_deltas=self._deltas.retained,
            retained_bytes=self._deltas.retained_bytes,
            load_origins=len(self._loads),
            incarnation=table.local.incarnation if table else 0,
        )

    def holds(self, origin: str, seq: int) -> bool:
        """Whether this node has received delta (origin, seq)."""
        return self._deltas.has(origin, seq)

    # -- loops ---------------------------------------------------------------------------------

    def _loop(
        self,
        name: str,
        interval: float,
        step: Callable[[], Awaitable[None]],
        phase: float | None = None,
    ) -> asyncio.Task[None]:
        # A random phase keeps replicas started together from acting in lockstep.
        delay = self._rng.uniform(0, interval) if phase is None else phase

        async def run() -> None:
            await self._clock.sleep(delay)
            while True:
                started = self._clock.now()
                try:
                    await step()
                except Exception:
                    self._counters.errors += 1
                    log.exception("gossip %s loop of %s failed", name, self.node_id)
                await self._clock.sleep(started + interval - self._clock.now())

        return asyncio.create_task(run(), name=f"gossip-{name}-{self.node_id}")

    def _can_spawn(self, key: str) -> bool:
        return key not in self._inflight and len(self._inflight) < self.tuning.max_inflight

    def _spawn(self, key: str, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` as an owned task, at most one per ``key`` and ``max_inflight`` in all."""
        if not self._can_spawn(key):
            coro.close()
            return False
        task = asyncio.create_task(coro, name=f"gossip-{key}-{self.node_id}")
        self._inflight[key] = task
        task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return True

    async def _round(self) -> None:
        self._take_local()
        table = self._members()
        # A peer still busy with the last exchange is skipped: a slow peer holds one task.
        peers = [p for p in table.peers(State.ALIVE, State.SUSPECT) if self._can_spawn(p.address)]
        if not peers:
            return
        self._counters.rounds += 1
        limit = self.tuning.retransmit_limit(table.live_count())
        for peer in self._rng.sample(peers, min(self.tuning.fanout, len(peers))):
            if not self._can_spawn(peer.address):
                break
            rumours = self._rumours(limit)
            if rumours is None:
                break
            self._spawn(peer.address, self._send_rumours(peer.address, rumours))

    async def _probe(self) -> None:
        t, table = self.tuning, self._members()
        now = self._clock.now()
        for change in table.expire(now, t.suspicion_timeout(table.live_count())):
            self._spread(change)
        table.reap(now, t.dead_reclaim)
        for origin in self._loads.expired(now, t.load_ttl, keep=self.node_id):
            self._delegate.forget_load(origin)
        self._wanted = {k: v for k, v in self._wanted.items() if v > now}
        target = table.next_probe(self._rng)
        if target is None:
            return
        self._counters.probes += 1
        if await self._ping(target.address, target.id, t.probe_timeout):
            return
        helpers = [p for p in table.peers(State.ALIVE) if p.id != target.id]
        helpers = self._rng.sample(helpers, min(t.indirect_checks, len(helpers)))
        window = t.probe_interval - t.probe_timeout
        reached = await asyncio.gather(
            *(self._indirect(h.address, target, window) for h in helpers)
        )
        if any(reached):
            return
        self._counters.probe_failures += 1
        current = table.get(target.id)
        if current is not None and current.incarnation == target.incarnation:
            suspected = table.suspect(target.id, self._clock.now())
            if suspected is not None:
                self._spread(suspected)

    async def _push_pull_random(self) -> None:
        peers = self._members().peers(State.ALIVE)
        if peers:
            await self._push_pull(self._rng.choice(peers).address)

    async def _rejoin(self) -> None:
        table = self._members()
        found = await self._discovery.addresses()
        fresh = [a for a in found if a != self.address and not table.address_known(a)]
        if fresh:
            self._rng.shuffle(fresh)
            await self.join(fresh[:JOIN_BATCH])

    # -- outgoing exchanges --------------------------------------------------------------------

    # Timeouts go to the transport (a gRPC deadline, or the virtual clock), not asyncio.timeout.
    async def _call(self, address: str, timeout: float | None = None, **body: Any) -> Any:  # noqa: ASYNC109
        """One authenticated exchange; the reply's body message, or None on any failure."""
        frame = self._envelopes.frame(self._clock.wall(), **body)
        payload = self._envelopes.seal(frame)
        try:
            raw = await self._transport.call(address, payload, timeout or self.tuning.call_timeout)
        except TransportError as e:
            self._counters.call_failures += 1
            log.debug("gossip call from %s to %s failed: %s", self.node_id, address, e)
            return None
        return self._envelopes.reply_body(raw, frame.nonce)

    async def _ping(self, address: str, target_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        ping = pb.Ping(target_id=target_id, members=self._piggyback())
        ack = await self._call(address, timeout, ping=ping)
        if not isinstance(ack, pb.Ack):
            return False
        self._merge_members(ack.members)
        return True

    async def _indirect(self, helper: str, target: Member, timeout: float) -> bool:  # noqa: ASYNC109
        req = pb.IndirectPing(target_id=target.id, target_address=target.address)
        reply = await self._call(helper, timeout, indirect_ping=req)
        return isinstance(reply, pb.IndirectAck) and reply.reached

    async def _send_rumours(self, address: str, rumours: pb.Rumours) -> None:
        reply = await self._call(address, rumours=rumours)
        if not isinstance(reply, pb.RumoursReply):
            return
        self._merge_members(reply.members)
        budget = self.tuning.max_message_bytes - 1024
        bodies = []
        for ids in reply.want:
            for seq in ids.seqs:
                delta = self._deltas.get(ids.origin, seq)
                if delta is not None and delta.ByteSize() + 16 <= budget:
                    budget -= delta.ByteSize() + 16
                    bodies.append(delta)
        if bodies:
            await self._call(address, updates=pb.Updates(deltas=bodies))

    async def _push_pull(self, address: str) -> bool:
        table = self._members()
        req = pb.PushPull(members=[member_to_pb(m) for m in table.all()], digest=self._digest())
        reply = await self._call(address, push_pull=req)
        if not isinstance(reply, pb.PushPullReply):
            return False
        self._merge_members(reply.members)
        for delta in reply.deltas:
            self._merge_delta(delta)
        for report in reply.loads:
            self._merge_load(report)
        repair = self._deltas.repair(
            digest_map(reply.digest.deltas), self.tuning.max_message_bytes - 64 * 1024
        )
        loads = self._loads.newer_than(digest_map(reply.digest.loads))
        if repair.deltas or loads:
            await self._call(address, updates=pb.Updates(deltas=repair.deltas, loads=loads))
        if reply.snapshot_advised:
            self._catch_up(address)
        return True

    def _catch_up(self, address: str) -> None:
        now = self._clock.now()
        if self._catching_up or now - self._snapshot_at < self.tuning.snapshot_cooldown:
            return
        self._snapshot_at = now
        self._spawn(f"snapshot:{address}", self._fetch_snapshot(address))

    async def _fetch_snapshot(self, address: str) -> None:
        self._catching_up = True
        try:
            timeout = self.tuning.snapshot_timeout
            first = await self._call(address, timeout, snapshot_request=pb.SnapshotRequest())
            if not isinstance(first, pb.SnapshotChunk) or first.chunks > MAX_SNAPSHOT_CHUNKS:
                return
            self._delegate.restore_blocks(first.engines)
            for i in range(1, first.chunks):
                req = pb.SnapshotRequest(snapshot_id=first.snapshot_id, chunk=i)
                chunk = await self._call(address, timeout, snapshot_request=req)
                if not isinstance(chunk, pb.SnapshotChunk) or chunk.chunk != i:
                    return
                self._delegate.restore_blocks(chunk.engines)
            floors = digest_map(first.covers.deltas)
            self._deltas.advance(floors)
            self._delegate.mark_seen(floors)
            for report in first.loads:
                self._merge_load(report)
            self._counters.snapshots_received += 1
        finally:
            self._catching_up = False

    async def _leave(self) -> None:
        table = self._members()
        me = member_to_pb(table.leave(self._clock.now()))
        peers = table.peers(State.ALIVE, State.SUSPECT)
        chosen = self._rng.sample(peers, min(self.tuning.fanout, len(peers)))
        rumours = pb.Rumours(members=[me])
        await asyncio.gather(*(self._call(p.address, rumours=rumours) for p in chosen))

    # -- serving -------------------------------------------------------------------------------

    async def _handle(self, payload: bytes) -> bytes:
        try:
            frame = self._envelopes.accept(payload, self._clock.wall())
        except AuthError as e:
            raise Refused(str(e)) from e
        kind = frame.WhichOneof("body")
        handler = self._handlers.get(kind or "")
        if not self._running or handler is None or frame.sender == self.node_id:
            reply_kind, body = "nack", pb.Nack(reason=f"cannot serve {kind}")
        else:
            try:
                reply_kind, body = await handler(getattr(frame, kind or ""))
            except Exception:
                # A delegate that fails on one message must not take the server down with it.
                self._counters.errors += 1
                log.exception(
                    "gossip %s failed to serve %s from %s", self.node_id, kind, frame.sender
                )
                reply_kind, body = "nack", pb.Nack(reason="internal error")
        reply = self._envelopes.frame(
            self._clock.wall(), reply_to=frame.nonce, **{reply_kind: body}
        )
        return self._envelopes.seal(reply)

    async def _on_ping(self, ping: pb.Ping) -> tuple[str, Any]:
        if ping.target_id and ping.target_id != self.node_id:
            return "nack", pb.Nack(reason=f"this is {self.node_id}, not {ping.target_id}")
        self._merge_members(ping.members)
        return "ack", pb.Ack(members=self._piggyback())

    async def _on_indirect_ping(self, req: pb.IndirectPing) -> tuple[str, Any]:
        window = self.tuning.probe_interval - self.tuning.probe_timeout
        reached = await self._ping(req.target_address, req.target_id, 0.8 * window)
        return "indirect_ack", pb.IndirectAck(reached=reached)

    async def _on_rumours(self, rumours: pb.Rumours) -> tuple[str, Any]:
        self._merge_members(rumours.members)
        for report in rumours.loads:
            self._merge_load(report)
        now = self._clock.now()
        until = now + self.tuning.want_timeout
        room = self.tuning.queue_items - len(self._wanted)
        want: list[tuple[str, int]] = []
        for ids in rumours.offers:
            for seq in ids.seqs:
                key = (ids.origin, seq)
                if self._deltas.has(*key) or self._wanted.get(key, -math.inf) > now:
                    continue
                if room > 0:
                    self._wanted[key] = until
                    room -= 1
                want.append(key)
        return "rumours_reply", pb.RumoursReply(want=group_ids(want), members=self._piggyback())

    async def _on_updates(self, updates: pb.Updates) -> tuple[str, Any]:
        for delta in updates.deltas:
            self._merge_delta(delta)
        for report in updates.loads:
            self._merge_load(report)
        return "ack", pb.Ack()

    async def _on_push_pull(self, req: pb.PushPull) -> tuple[str, Any]:
        self._merge_members(req.members)
        budget = self.tuning.max_message_bytes - 64 * 1024
        repair = self._deltas.repair(digest_map(req.digest.deltas), budget)
        reply = pb.PushPullReply(
            members=[member_to_pb(m) for m in self._members().all()],
            digest=self._digest(),
            deltas=repair.deltas,
            loads=self._loads.newer_than(digest_map(req.digest.loads)),
            snapshot_advised=repair.snapshot_advised,
        )
        return "push_pull_reply", reply

    async def _on_snapshot_request(self, req: pb.SnapshotRequest) -> tuple[str, Any]:
        now = self._clock.now()
        if req.snapshot_id:
            chunk = self._sessions.chunk(req.snapshot_id, req.chunk, now)
            if chunk is None:
                return "nack", pb.Nack(reason="snapshot unknown or expired")
            return "snapshot_chunk", chunk
        if not self._sessions.has_room(now):
            return "nack", pb.Nack(reason="busy: too many snapshots in progress")
        covers = self._digest()
        loads = list(self._loads.reports())
        parts: list[list[pb.EngineBlocks]] = []
        for part in self._delegate.export_blocks(self.tuning.snapshot_chunk_bytes):
            parts.append(part)
            # Copying a large index takes a while: let other work run between chunks.
            await asyncio.sleep(0)
        self._counters.snapshots_sent += 1
        return "snapshot_chunk", self._sessions.open(covers, loads, parts, self._clock.now())

    # -- merging -------------------------------------------------------------------------------

    def _merge_members(self, members: Iterable[pb.Member]) -> None:
        table, now = self._members(), self._clock.now()
        for m in members:
            member = member_from_pb(m)
            if member is None:
                continue
            change = table.merge(member, now)
            if change is not None:
                self._spread(change)

    def _spread(self, change: Change) -> None:
        m = change.member
        self._member_q.push(m.id, member_to_pb(m), len(m.id) + len(m.address) + 16)
        if change.died and m.id != self.node_id:
            self._load_q.discard(m.id)
            if self._loads.forget(m.id):
                self._delegate.forget_load(m.id)

    def _merge_delta(self, delta: pb.Delta) -> None:
        if not delta.origin or delta.seq < 1:
            return
        self._wanted.pop((delta.origin, delta.seq), None)
        if not self._deltas.add(delta, self._clock.wall()):
            self._counters.deltas_duplicate += 1
            return
        self._delegate.merge_delta(delta)
        self._counters.deltas_applied += 1
        self._offer_q.push((delta.origin, delta.seq), (delta.origin, delta.seq), 4)

    def _merge_load(self, report: pb.LoadReport) -> None:
        origin = report.origin
        if not origin or origin == self.node_id:
            return
        member = self._members().get(origin)
        if member is not None and member.state is State.DEAD:
            self._counters.loads_dropped += 1
            return
        if not self._loads.offer(report, self._clock.now()):
            return
        self._delegate.merge_load(origin, report.engines)
        self._counters.loads_applied += 1
        self._load_q.push(origin, report, report.ByteSize() + 4)

    def _take_local(self) -> None:
        wall = self._clock.wall()
        for delta in self._delegate.local_deltas(self.tuning.local_queue):
            if self._deltas.add(delta, wall, local=True):
                self._counters.deltas_published += 1
                self._offer_q.push((delta.origin, delta.seq), (delta.origin, delta.seq), 4)
        now = self._clock.now()
        t = self.tuning
        if now - self._load_sent_at < t.load_interval:
            return
        engines = self._delegate.local_load()
        # Unchanged figures are re-sent only often enough to outlive the peers' TTL.
        if engines == self._load_sent and now - self._load_sent_at < t.load_ttl / 3:
            return
        self._load_version = max(self._load_version + 1, int(self._clock.wall() * 1000))
        report = pb.LoadReport(
            origin=self.node_id,
            version=self._load_version,
            created_unix_ms=int(self._clock.wall() * 1000),
            engines=engines,
        )
        self._load_sent, self._load_sent_at = engines, now
        self._loads.offer(report, now)
        self._load_q.push(self.node_id, report, report.ByteSize() + 4)

    # -- helpers -------------------------------------------------------------------------------

    def _members(self) -> MemberTable:
        if self._table is None:
            raise RuntimeError(f"gossip node {self.node_id} is not started")
        return self._table

    def _rumours(self, limit: int) -> pb.Rumours | None:
        budget = self.tuning.rumours_bytes
        members = self._member_q.take(budget // 4, limit)
        budget -= sum(m.ByteSize() + 4 for m in members)
        loads = self._load_q.take(budget // 2, limit)
        budget -= sum(r.ByteSize() + 4 for r in loads)
        offers = self._offer_q.take(budget, limit, keep=lambda i: self._deltas.get(*i) is not None)
        if not (members or loads or offers):
            return None
        return pb.Rumours(members=members, loads=loads, offers=group_ids(offers))

    def _piggyback(self) -> list[pb.Member]:
        limit = self.tuning.retransmit_limit(self._members().live_count())
        return self._member_q.take(PIGGYBACK_BYTES, limit)

    def _digest(self) -> pb.Digest:
        return pb.Digest(
            deltas=to_digest(self._deltas.floors()), loads=to_digest(self._loads.versions())
        )
