"""A node's replicated state without a node: merging, spreading, asking and answering.

``NodeState`` does no I/O, so two of them can hold a whole exchange by hand: one builds the
request, the other answers, the first applies the reply. The delegate here only records what
the state delivered to it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from router.gossip.config import LAN
from router.gossip.membership import Member, State
from router.gossip.state import NodeState
from router.gossip.stats import Counters
from router.gossip.wire import member_to_pb, pb

T0 = 100.0
WALL = 1_700_000_000.0


@dataclass
class RecordingDelegate:
    """A Delegate that hands out what a test gives it and records what it is given."""

    pending: list[pb.Delta] = field(default_factory=list)
    load: list[pb.EngineLoad] = field(default_factory=list)
    heat: list[pb.PrefixHeat] = field(default_factory=list)
    merged: list[tuple[str, int]] = field(default_factory=list)
    loads: dict[str, list[pb.EngineLoad]] = field(default_factory=dict)
    heats: dict[str, list[pb.PrefixHeat]] = field(default_factory=dict)
    forgotten: list[str] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)

    def local_deltas(self, limit: int) -> list[pb.Delta]:
        out, self.pending = self.pending[:limit], self.pending[limit:]
        return out

    def local_load(self) -> list[pb.EngineLoad]:
        return list(self.load)

    def local_heat(self) -> list[pb.PrefixHeat]:
        return list(self.heat)

    def merge_delta(self, delta: pb.Delta) -> None:
        self.merged.append((delta.origin, delta.seq))

    def merge_load(
        self, origin: str, engines: Sequence[pb.EngineLoad], prefixes: Sequence[pb.PrefixHeat]
    ) -> None:
        self.loads[origin] = list(engines)
        self.heats[origin] = list(prefixes)

    def forget_load(self, origin: str) -> None:
        self.forgotten.append(origin)

    def export_blocks(self, chunk_bytes: int) -> Iterator[list[pb.EngineBlocks]]:
        yield []

    def restore_blocks(self, engines: Sequence[pb.EngineBlocks]) -> None:
        pass

    def mark_seen(self, floors: Mapping[str, int]) -> None:
        self.seen.update(floors)


def _state(node_id: str = "a") -> tuple[NodeState, RecordingDelegate, Counters]:
    delegate, counters = RecordingDelegate(), Counters()
    state = NodeState(node_id, LAN, delegate, counters)
    state.start(f"{node_id}:7946", T0, WALL)
    return state, delegate, counters


def _member(node_id: str, state: State = State.ALIVE, incarnation: int = 1) -> pb.Member:
    return member_to_pb(Member(node_id, f"{node_id}:7946", incarnation, state))


def _delta(origin: str, seq: int) -> pb.Delta:
    return pb.Delta(origin=origin, seq=seq, engine="e", added=[seq])


def _report(origin: str, version: int, requests: int = 1) -> pb.LoadReport:
    engines = [pb.EngineLoad(engine="e", requests=requests)]
    return pb.LoadReport(origin=origin, version=version, engines=engines)


def _offered(rumours: pb.Rumours | None) -> set[tuple[str, int]]:
    assert rumours is not None
    return {(ids.origin, s) for ids in rumours.offers for s in ids.seqs}


# -- members -----------------------------------------------------------------------------------


def test_state_before_start_members_raise_and_stats_zero() -> None:
    state = NodeState("a", LAN, RecordingDelegate(), Counters())
    with pytest.raises(RuntimeError, match="not started"):
        state.members  # noqa: B018
    stats = state.stats()
    assert stats.peers == {"alive": 0, "suspect": 0, "dead": 0} and stats.incarnation == 0


def test_state_start_queues_own_alive_first() -> None:
    state, _, _ = _state("a")
    rumours = state.rumours(limit=1)
    assert rumours is not None
    assert [(m.id, m.state) for m in rumours.members] == [("a", pb.MEMBER_STATE_ALIVE)]


@pytest.mark.parametrize(
    ("rumour", "known"),
    [
        pytest.param(_member("b"), True, id="new_alive"),
        pytest.param(_member("b", State.DEAD), False, id="unknown_dead"),
        pytest.param(_member(""), False, id="no_id"),
        pytest.param(
            pb.Member(id="b", address="b:1", state=pb.MEMBER_STATE_UNSPECIFIED),
            False,
            id="no_state",
        ),
    ],
)
def test_state_merge_members_only_news_spread(rumour: pb.Member, known: bool) -> None:
    state, _, _ = _state("a")
    state.rumours(limit=1)  # its own news is out of the way
    state.merge_members([rumour], T0)
    assert (state.members.get("b") is not None) == known
    spread = state.rumours(limit=1)
    assert (spread is not None and list(spread.members) == [rumour]) == known


def test_state_member_dies_its_load_forgotten() -> None:
    state, delegate, _ = _state("a")
    state.merge_members([_member("b")], T0)
    state.merge_load(_report("b", 1), T0)
    state.merge_members([_member("b", State.DEAD)], T0 + 1)
    assert delegate.forgotten == ["b"] and state.loads.get("b") is None


@pytest.mark.parametrize(
    ("now_incarnation", "suspected"),
    [pytest.param(1, True, id="same_incarnation"), pytest.param(2, False, id="refuted_since")],
)
def test_state_suspect_only_when_not_refuted(now_incarnation: int, suspected: bool) -> None:
    state, _, _ = _state("a")
    state.merge_members([_member("b", incarnation=1)], T0)
    probed = state.members.get("b")
    assert probed is not None
    state.merge_members([_member("b", incarnation=now_incarnation)], T0)
    state.suspect(probed, T0 + 1)
    current = state.members.get("b")
    assert current is not None and (current.state is State.SUSPECT) == suspected


def test_state_expire_suspect_dies_and_stale_load_forgotten() -> None:
    state, delegate, _ = _state("a")
    state.merge_members([_member("b"), _member("c")], T0)
    state.merge_load(_report("c", 1), T0)
    probed = state.members.get("b")
    assert probed is not None
    state.suspect(probed, T0)
    state.expire(T0 + LAN.load_ttl + LAN.suspicion_timeout(3))
    dead = state.members.get("b")
    assert dead is not None and dead.state is State.DEAD
    assert delegate.forgotten == ["c"]


# -- deltas and load ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deltas", "merged", "applied", "duplicate"),
    [
        pytest.param([_delta("b", 1)], [("b", 1)], 1, 0, id="new"),
        pytest.param([_delta("b", 1)] * 2, [("b", 1)], 1, 1, id="twice"),
        pytest.param([_delta("", 1)], [], 0, 0, id="no_origin"),
        pytest.param([_delta("b", 0)], [], 0, 0, id="seq_zero"),
    ],
)
def test_state_merge_delta_delivered_once(
    deltas: list[pb.Delta], merged: list[tuple[str, int]], applied: int, duplicate: int
) -> None:
    state, delegate, counters = _state("a")
    for delta in deltas:
        state.merge_delta(delta, WALL)
    assert delegate.merged == merged
    assert (counters.deltas_applied, counters.deltas_duplicate) == (applied, duplicate)


def test_state_merged_delta_offered_on() -> None:
    state, _, _ = _state("a")
    state.merge_delta(_delta("b", 1), WALL)
    assert _offered(state.rumours(limit=6)) == {("b", 1)}


@pytest.mark.parametrize(
    ("held", "report", "delivered", "dropped"),
    [
        pytest.param(None, _report("b", 2), True, 0, id="first"),
        pytest.param(_report("b", 1), _report("b", 2), True, 0, id="newer"),
        pytest.param(_report("b", 2), _report("b", 2, requests=9), False, 0, id="same_version"),
        pytest.param(None, _report("a", 5), False, 0, id="own"),
        pytest.param(None, _report("dead", 1), False, 1, id="from_the_dead"),
    ],
)
def test_state_merge_load_newer_from_living_only(
    held: pb.LoadReport | None, report: pb.LoadReport, delivered: bool, dropped: int
) -> None:
    state, delegate, counters = _state("a")
    state.merge_members([_member("dead"), _member("dead", State.DEAD)], T0)
    if held is not None:
        state.merge_load(held, T0)
    delegate.loads.clear()
    state.merge_load(report, T0)
    assert (report.origin in delegate.loads) == delivered
    assert counters.loads_dropped == dropped


@pytest.mark.parametrize(
    ("after", "changed", "sent"),
    [
        pytest.param(LAN.load_interval / 2, True, False, id="too_soon"),
        pytest.param(LAN.load_interval, False, False, id="unchanged"),
        pytest.param(LAN.load_interval, True, True, id="changed"),
        pytest.param(LAN.load_ttl / 3, False, True, id="unchanged_refresh_before_ttl"),
    ],
)
def test_state_take_local_load_sent_when_due(after: float, changed: bool, sent: bool) -> None:
    state, delegate, _ = _state("a")
    delegate.load = [pb.EngineLoad(engine="e", requests=1)]
    state.take_local(T0, WALL)
    first = state.loads.get("a")
    assert first is not None
    if changed:
        delegate.load = [pb.EngineLoad(engine="e", requests=2)]
    state.take_local(T0 + after, WALL + after)
    latest = state.loads.get("a")
    assert latest is not None and (latest.version > first.version) == sent


@pytest.mark.parametrize(
    ("rumours", "sent"),
    [
        pytest.param([_member("b")], True, id="joined"),
        pytest.param(
            [_member("b"), _member("b", State.DEAD), _member("b", incarnation=2)],
            True,
            id="back_from_the_dead",
        ),
        pytest.param(
            [_member("b"), _member("b", State.SUSPECT), _member("b", incarnation=2)],
            False,
            id="suspicion_refuted",
        ),
    ],
)
def test_state_member_joined_or_back_load_sent_unchanged(
    rumours: list[pb.Member], sent: bool
) -> None:
    state, delegate, _ = _state("a")
    delegate.load = [pb.EngineLoad(engine="e", requests=1)]
    state.merge_members(rumours[:-1], T0)
    state.take_local(T0, WALL)
    first = state.loads.get("a")
    assert first is not None
    # The figures are the same, well before a refresh: only a member that holds no report of
    # them (a new one, or one that was dead to this node) is a reason to send them again.
    state.merge_members(rumours[-1:], T0 + LAN.load_interval)
    state.take_local(T0 + LAN.load_interval, WALL + LAN.load_interval)
    latest = state.loads.get("a")
    assert latest is not None and (latest.version > first.version) == sent


def test_state_prefix_heat_travels_with_the_load() -> None:
    (a, a_delegate, _), (b, b_delegate, _) = _state("a"), _state("b")
    a_delegate.load = [pb.EngineLoad(engine="e", requests=3)]
    a.take_local(T0, WALL)
    # The engines' load unchanged, a prefix hotter: that is news, reported when due.
    a_delegate.heat = [pb.PrefixHeat(prefix=2**64 - 1, requests=3)]
    later = T0 + LAN.load_interval
    a.take_local(later, WALL + LAN.load_interval)
    report = a.loads.get("a")
    assert report is not None
    b.merge_members([_member("a")], later)
    b.merge_load(pb.LoadReport.FromString(report.SerializeToString()), later)
    assert [(h.prefix, h.requests) for h in b_delegate.heats["a"]] == [(2**64 - 1, 3)]


def test_state_take_local_deltas_published_and_offered_once() -> None:
    state, delegate, counters = _state("a")
    delegate.pending = [_delta("a", 1), _delta("a", 2)]
    state.take_local(T0, WALL)
    delegate.pending = [_delta("a", 2)]
    state.take_local(T0, WALL)
    assert counters.deltas_published == 2 and delegate.merged == []
    assert _offered(state.rumours(limit=6)) == {("a", 1), ("a", 2)}


# -- exchanges ---------------------------------------------------------------------------------


def _offer(*ids: tuple[str, int]) -> pb.Rumours:
    return pb.Rumours(offers=[pb.DeltaIds(origin=o, seqs=[s]) for o, s in ids])


def _wants(reply: pb.RumoursReply) -> set[tuple[str, int]]:
    return {(ids.origin, s) for ids in reply.want for s in ids.seqs}


@pytest.mark.parametrize(
    ("asked_before", "now", "wanted"),
    [
        pytest.param(False, T0, {("c", 1), ("c", 2)}, id="fresh"),
        pytest.param(True, T0 + LAN.want_timeout / 2, set(), id="asked_of_another"),
        pytest.param(True, T0 + LAN.want_timeout, {("c", 1), ("c", 2)}, id="asked_and_timed_out"),
    ],
)
def test_state_answer_rumours_wants_offers_not_held_nor_asked(
    asked_before: bool, now: float, wanted: set[tuple[str, int]]
) -> None:
    state, _, _ = _state("a")
    state.merge_delta(_delta("c", 3), WALL)
    offer = _offer(("c", 1), ("c", 2), ("c", 3))
    if asked_before:
        state.answer_rumours(offer, T0)
    assert _wants(state.answer_rumours(offer, now)) == wanted


def test_state_rumours_round_trip_delivers_bodies() -> None:
    (a, a_delegate, _), (b, b_delegate, _) = _state("a"), _state("b")
    a_delegate.pending = [_delta("a", 1), _delta("a", 2)]
    a.take_local(T0, WALL)
    rumours = a.rumours(limit=6)
    assert rumours is not None
    reply = b.answer_rumours(rumours, T0)
    bodies = a.apply_rumours_reply(reply, T0)
    b.apply_updates(pb.Updates(deltas=bodies), T0, WALL)
    assert sorted(b_delegate.merged) == [("a", 1), ("a", 2)]
    assert b.members.get("a") is not None  # a's own news rode along


def test_state_push_pull_repairs_both_sides() -> None:
    (a, a_delegate, _), (b, b_delegate, _) = _state("a"), _state("b")
    a.merge_delta(_delta("x", 1), WALL)
    a.merge_load(_report("x", 3), T0)
    b.merge_delta(_delta("y", 1), WALL)
    reply = a.answer_push_pull(b.push_pull(), T0)
    updates = b.apply_push_pull_reply(reply, T0, WALL)
    assert updates is not None and not reply.snapshot_advised
    a.apply_updates(updates, T0, WALL)
    assert b_delegate.merged == [("y", 1), ("x", 1)] and "x" in b_delegate.loads
    assert a_delegate.merged == [("x", 1), ("y", 1)]
    assert {m.id for m in a.members.all()} == {m.id for m in b.members.all()} == {"a", "b"}
    # Now level: a second exchange has nothing to repair.
    again = b.apply_push_pull_reply(a.answer_push_pull(b.push_pull(), T0), T0, WALL)
    assert again is None


def test_state_apply_snapshot_counts_floors_held_and_merges_loads() -> None:
    state, delegate, _ = _state("a")
    first = pb.SnapshotChunk(chunks=1, loads=[_report("x", 1)])
    first.covers.deltas.add(origin="x", seq=5)
    state.apply_snapshot(first, T0)
    assert state.deltas.has("x", 5) and not state.deltas.has("x", 6)
    assert delegate.seen == {"x": 5} and "x" in delegate.loads


def test_state_leave_announces_own_death() -> None:
    state, _, _ = _state("a")
    assert state.leave(T0) == member_to_pb(state.members.local)
    assert state.members.local.state is State.DEAD
