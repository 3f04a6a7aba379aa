"""What one node knows and what it spreads: its replicated state and the protocol's decisions.

``NodeState`` holds the member table, the delta and load stores, the three rumour queues
(members, load reports, offers of delta ids) and the delta ids already asked of some peer. Its
methods are everything the node decides without waiting on anyone: merge what a peer sent and
queue what changed to be spread; pick the rumours for one message and the members to
piggyback; answer a peer's rumours and push-pull, and apply a peer's reply; take the delegate's
local deltas and load into the queues; expire suspicions, the long dead and stale load.

No I/O and no awaiting: every method runs to completion on the event loop, and time is passed in
(``now`` from the monotonic clock, ``wall`` from the wall clock). ``GossipNode`` owns the loops
and the network and calls these between exchanges. What a delta or a load figure means stays
the delegate's; this class only decides what is new and what to pass on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from router.gossip.broadcast import TransmitQueue
from router.gossip.config import Tuning
from router.gossip.delegate import Delegate
from router.gossip.membership import Change, Member, MemberTable, State
from router.gossip.stats import Counters, GossipStats, copy_counters
from router.gossip.store import DeltaStore, LoadStore
from router.gossip.wire import digest_map, group_ids, member_from_pb, member_to_pb, pb, to_digest

# Membership rumours piggybacked on a ping, an ack or a reply: a handful, not a round's worth.
PIGGYBACK_BYTES = 2048
# Room kept in a message beside the delta bodies it carries: a repair leaves space for the
# members, digest and load reports sent with it; bodies pushed on request need only a frame.
REPAIR_HEADROOM = 64 * 1024
PUSH_HEADROOM = 1024


class NodeState:
    """One node's members, deltas, load reports and rumour queues, and how they change."""

    def __init__(
        self, node_id: str, tuning: Tuning, delegate: Delegate, counters: Counters
    ) -> None:
        t = tuning
        self.node_id = node_id
        self.tuning = t
        self.deltas = DeltaStore(t.retained_bytes, t.retained_per_origin, t.max_origins)
        self.loads = LoadStore(t.max_members)
        self._delegate = delegate
        self._counters = counters
        self._table: MemberTable | None = None
        self._member_q: TransmitQueue[str, pb.Member] = TransmitQueue(t.max_members)
        self._load_q: TransmitQueue[str, pb.LoadReport] = TransmitQueue(t.max_members)
        self._offer_q: TransmitQueue[tuple[str, int], tuple[str, int]] = TransmitQueue(
            t.queue_items
        )
        # Delta ids asked of some peer, until when: not asked again of others meanwhile.
        self._wanted: dict[tuple[str, int], float] = {}
        self._load_version = 0
        self._load_sent: tuple[list[pb.EngineLoad], list[pb.PrefixHeat]] | None = None
        self._load_sent_at = -math.inf

    def start(self, address: str, now: float, wall: float) -> None:
        """Enter the table as alive at ``address`` and queue that news first."""
        self._table = MemberTable(self.node_id, address, now, self.tuning.max_members)
        self._member_q.push(self.node_id, member_to_pb(self._table.local), 64)
        self._load_version = int(wall * 1000)

    @property
    def members(self) -> MemberTable:
        """The member table; a RuntimeError before ``start``."""
        if self._table is None:
            raise RuntimeError(f"gossip node {self.node_id} is not started")
        return self._table

    def stats(self) -> GossipStats:
        """Counters and gauges right now (zeros for the members before ``start``)."""
        table = self._table
        c = copy_counters(self._counters)
        c.queue_dropped = self._member_q.dropped + self._load_q.dropped + self._offer_q.dropped
        return GossipStats(
            node_id=self.node_id,
            counters=c,
            peers=table.counts() if table else {s.name.lower(): 0 for s in State},
            convergence_lag=dict(self.deltas.lag),
            queued_rumours=len(self._member_q) + len(self._load_q) + len(self._offer_q),
            retained_deltas=self.deltas.retained,
            retained_bytes=self.deltas.retained_bytes,
            load_origins=len(self.loads),
            incarnation=table.local.incarnation if table else 0,
        )

    # -- merging what peers send ---------------------------------------------------------------

    def merge_members(self, members: Iterable[pb.Member], now: float) -> None:
        """Apply membership rumours; spread those that changed the table."""
        table = self.members
        for m in members:
            member = member_from_pb(m)
            if member is None:
                continue
            change = table.merge(member, now)
            if change is not None:
                self._spread(change)

    def merge_delta(self, delta: pb.Delta, wall: float) -> None:
        """Deliver a delta to the delegate once, and offer its id to peers."""
        if not delta.origin or delta.seq < 1:
            return
        self._wanted.pop((delta.origin, delta.seq), None)
        if not self.deltas.add(delta, wall):
            self._counters.deltas_duplicate += 1
            return
        self._delegate.merge_delta(delta)
        self._counters.deltas_applied += 1
        self._offer_q.push((delta.origin, delta.seq), (delta.origin, delta.seq), 4)

    def merge_load(self, report: pb.LoadReport, now: float) -> None:
        """Deliver a newer load report of a live peer to the delegate, and pass it on."""
        origin = report.origin
        if not origin or origin == self.node_id:
            return
        member = self.members.get(origin)
        if member is not None and member.state is State.DEAD:
            self._counters.loads_dropped += 1
            return
        if not self.loads.offer(report, now):
            return
        self._delegate.merge_load(origin, report.engines, report.prefixes)
        self._counters.loads_applied += 1
        self._load_q.push(origin, report, report.ByteSize() + 4)

    def _merge_all(
        self, deltas: Iterable[pb.Delta], loads: Iterable[pb.LoadReport], now: float, wall: float
    ) -> None:
        for delta in deltas:
            self.merge_delta(delta, wall)
        for report in loads:
            self.merge_load(report, now)

    def _spread(self, change: Change) -> None:
        m = change.member
        self._member_q.push(m.id, member_to_pb(m), len(m.id) + len(m.address) + 16)
        before = change.before
        if m.state is State.ALIVE and (before is None or before.state is State.DEAD):
            # A member joined or came back (a healed partition): it holds no report of this
            # node's load, so the next round sends one, unchanged or not.
            self._load_sent = None
        if change.died and m.id != self.node_id:
            self._load_q.discard(m.id)
            if self.loads.forget(m.id):
                self._delegate.forget_load(m.id)

    # -- exchanges, one side at a time ---------------------------------------------------------

    def rumours(self, limit: int) -> pb.Rumours | None:
        """The rumours for one message, each sent at most ``limit`` times; None if none wait."""
        budget = self.tuning.rumours_bytes
        members = self._member_q.take(budget // 4, limit)
        budget -= sum(m.ByteSize() + 4 for m in members)
        loads = self._load_q.take(budget // 2, limit)
        budget -= sum(r.ByteSize() + 4 for r in loads)
        offers = self._offer_q.take(budget, limit, keep=lambda i: self.deltas.get(*i) is not None)
        if not (members or loads or offers):
            return None
        return pb.Rumours(members=members, loads=loads, offers=group_ids(offers))

    def piggyback(self) -> list[pb.Member]:
        """A few membership rumours to ride on a ping, an ack or a reply."""
        limit = self.tuning.retransmit_limit(self.members.live_count())
        return self._member_q.take(PIGGYBACK_BYTES, limit)

    def answer_rumours(self, rumours: pb.Rumours, now: float) -> pb.RumoursReply:
        """Merge a peer's rumours; ask for the offered deltas not held nor asked of another."""
        self.merge_members(rumours.members, now)
        for report in rumours.loads:
            self.merge_load(report, now)
        until = now + self.tuning.want_timeout
        room = self.tuning.queue_items - len(self._wanted)
        want: list[tuple[str, int]] = []
        for ids in rumours.offers:
            for seq in ids.seqs:
                key = (ids.origin, seq)
                if self.deltas.has(*key) or self._wanted.get(key, -math.inf) > now:
                    continue
                if room > 0:
                    self._wanted[key] = until
                    room -= 1
                want.append(key)
        return pb.RumoursReply(want=group_ids(want), members=self.piggyback())

    def apply_rumours_reply(self, reply: pb.RumoursReply, now: float) -> list[pb.Delta]:
        """Merge the members a reply carries; the bodies it asked for that fit one message."""
        self.merge_members(reply.members, now)
        budget = self.tuning.max_message_bytes - PUSH_HEADROOM
        bodies = []
        for ids in reply.want:
            for seq in ids.seqs:
                delta = self.deltas.get(ids.origin, seq)
                if delta is not None and delta.ByteSize() + 16 <= budget:
                    budget -= delta.ByteSize() + 16
                    bodies.append(delta)
        return bodies

    def apply_updates(self, updates: pb.Updates, now: float, wall: float) -> None:
        """Merge the delta bodies and load reports a peer pushed."""
        self._merge_all(updates.deltas, updates.loads, now, wall)

    def digest(self) -> pb.Digest:
        """Per origin, the delta seq held up to and the newest load version."""
        return pb.Digest(
            deltas=to_digest(self.deltas.floors()), loads=to_digest(self.loads.versions())
        )

    def push_pull(self) -> pb.PushPull:
        """Every member this node knows and its digest, for a peer to repair both sides."""
        return pb.PushPull(
            members=[member_to_pb(m) for m in self.members.all()], digest=self.digest()
        )

    def answer_push_pull(self, req: pb.PushPull, now: float) -> pb.PushPullReply:
        """Merge a peer's members; send ours, our digest and what its digest lacks."""
        self.merge_members(req.members, now)
        repair = self.deltas.repair(
            digest_map(req.digest.deltas), self.tuning.max_message_bytes - REPAIR_HEADROOM
        )
        return pb.PushPullReply(
            members=[member_to_pb(m) for m in self.members.all()],
            digest=self.digest(),
            deltas=repair.deltas,
            loads=self.loads.newer_than(digest_map(req.digest.loads)),
            snapshot_advised=repair.snapshot_advised,
        )

    def apply_push_pull_reply(
        self, reply: pb.PushPullReply, now: float, wall: float
    ) -> pb.Updates | None:
        """Merge a push-pull reply; the updates its digest lacks, or None when it lacks none."""
        self.merge_members(reply.members, now)
        self._merge_all(reply.deltas, reply.loads, now, wall)
        repair = self.deltas.repair(
            digest_map(reply.digest.deltas), self.tuning.max_message_bytes - REPAIR_HEADROOM
        )
        loads = self.loads.newer_than(digest_map(reply.digest.loads))
        if not (repair.deltas or loads):
            return None
        return pb.Updates(deltas=repair.deltas, loads=loads)

    def apply_snapshot(self, first: pb.SnapshotChunk, now: float) -> None:
        """What a restored snapshot covers: its delta floors count as held, its loads merge."""
        floors = digest_map(first.covers.deltas)
        self.deltas.advance(floors)
        self.deltas.skipped.clear()
        self._delegate.mark_seen(floors)
        for report in first.loads:
            self.merge_load(report, now)

    # -- this node's own news and the passing of time ------------------------------------------

    def take_local(self, now: float, wall: float) -> None:
        """Queue the delegate's new local deltas, and its load when due or changed."""
        for delta in self._delegate.local_deltas(self.tuning.local_queue):
            if self.deltas.add(delta, wall, local=True):
                self._counters.deltas_published += 1
                self._offer_q.push((delta.origin, delta.seq), (delta.origin, delta.seq), 4)
        t = self.tuning
        if now - self._load_sent_at < t.load_interval:
            return
        figures = self._delegate.local_load(), self._delegate.local_heat()
        # Unchanged figures are re-sent only often enough to outlive the peers' TTL.
        if figures == self._load_sent and now - self._load_sent_at < t.load_ttl / 3:
            return
        self._load_version = max(self._load_version + 1, int(wall * 1000))
        report = pb.LoadReport(
            origin=self.node_id,
            version=self._load_version,
            created_unix_ms=int(wall * 1000),
            engines=figures[0],
            prefixes=figures[1],
        )
        self._load_sent, self._load_sent_at = figures, now
        self.loads.offer(report, now)
        self._load_q.push(self.node_id, report, report.ByteSize() + 4)

    def expire(self, now: float) -> None:
        """Overdue suspects die, the long dead are forgotten, and so is stale load and asks."""
        t, table = self.tuning, self.members
        for change in table.expire(now, t.suspicion_timeout(table.live_count())):
            self._spread(change)
        table.reap(now, t.dead_reclaim)
        for origin in self.loads.expired(now, t.load_ttl, keep=self.node_id):
            self._delegate.forget_load(origin)
        self._wanted = {k: v for k, v in self._wanted.items() if v > now}

    def suspect(self, probed: Member, now: float) -> None:
        """``probed`` failed its probes: suspect it, unless it has refuted since."""
        current = self.members.get(probed.id)
        if current is not None and current.incarnation == probed.incarnation:
            suspected = self.members.suspect(probed.id, now)
            if suspected is not None:
                self._spread(suspected)

    def leave(self, now: float) -> pb.Member:
        """This node is leaving: the rumour that announces it."""
        return member_to_pb(self.members.leave(now))
