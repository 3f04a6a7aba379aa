"""Gossip building blocks without a network: queue, members, wire, auth, stores, config, bridge."""

from __future__ import annotations

import dataclasses
import random

import pytest

from router.core.fields import ConfigError
from router.core.index import BlockIndex, IndexLimits
from router.core.load import HOT_PREFIXES, Load, LoadBook
from router.core.seq import SeqWindow
from router.gateway.replicas.delegate import IndexDelegate, run_origin
from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.broadcast import TransmitQueue
from router.gossip.config import LAN, LOCAL, GossipConfig, secret_from_env
from router.gossip.membership import Member, MemberTable, State
from router.gossip.snapshot import SnapshotSessions
from router.gossip.stats import samples
from router.gossip.store import DeltaStore, LoadStore
from router.gossip.wire import member_from_pb, member_to_pb, pb

SECRET = b"0123456789abcdef-secret"

# -- broadcast queue ---------------------------------------------------------------------------


def test_queue_retransmit_limit_reached_item_leaves() -> None:
    q: TransmitQueue[str, str] = TransmitQueue(max_items=10)
    q.push("a", "A", 1)
    sent = [q.take(budget=100, limit=3) for _ in range(5)]
    assert sent == [["A"], ["A"], ["A"], [], []]
    assert len(q) == 0


def test_queue_same_key_replaces_and_resets_count() -> None:
    q: TransmitQueue[str, str] = TransmitQueue(max_items=10)
    q.push("a", "old", 1)
    q.take(100, limit=2)
    q.push("a", "new", 1)
    assert q.take(100, limit=2) == ["new"]
    assert q.take(100, limit=2) == ["new"]
    assert q.take(100, limit=2) == []


def test_queue_least_sent_first_within_budget() -> None:
    q: TransmitQueue[str, str] = TransmitQueue(max_items=10)
    q.push("old", "old", 10)
    q.take(100, limit=5)
    q.push("new", "new", 10)
    assert q.take(budget=15, limit=5) == ["new"]
    # Both sent once now: the newer goes first.
    assert q.take(budget=100, limit=5) == ["new", "old"]


def test_queue_over_capacity_drops_most_sent() -> None:
    q: TransmitQueue[int, int] = TransmitQueue(max_items=3)
    q.push(0, 0, 1)
    q.take(100, limit=9)
    for i in range(1, 4):
        q.push(i, i, 1)
    assert len(q) == 3 and 0 not in q and q.dropped == 1


def test_queue_keep_false_drops_stale_item() -> None:
    q: TransmitQueue[int, int] = TransmitQueue(max_items=10)
    q.push(1, 1, 1)
    q.push(2, 2, 1)
    assert q.take(100, limit=5, keep=lambda v: v != 1) == [2]
    assert 1 not in q


@pytest.mark.parametrize(
    ("nodes", "limit"), [(1, 6), (3, 6), (9, 6), (10, 12), (16, 12), (32, 12), (99, 12), (100, 18)]
)
def test_tuning_retransmit_limit_mult_log10(nodes: int, limit: int) -> None:
    assert LAN.retransmit_limit(nodes) == limit


# -- member table ------------------------------------------------------------------------------

A, S, D = State.ALIVE, State.SUSPECT, State.DEAD


@pytest.mark.parametrize(
    ("known", "rumour", "accepted"),
    [
        ((1, A), (1, A), False),
        ((1, A), (2, A), True),
        ((1, A), (1, S), True),
        ((1, A), (0, S), False),
        ((1, S), (1, A), False),
        ((1, S), (2, A), True),
        ((1, S), (1, D), True),
        ((1, D), (1, A), False),
        ((1, D), (1, S), False),
        ((1, D), (2, A), True),
        ((2, A), (1, D), False),
    ],
    ids=lambda v: f"{v[1].name.lower()}{v[0]}" if isinstance(v, tuple) else str(v).lower(),
)
def test_members_merge_precedence_incarnation_then_state(
    known: tuple[int, State], rumour: tuple[int, State], accepted: bool
) -> None:
    table = MemberTable("me", "me:1", 0.0, 16)
    table.merge(Member("x", "x:1", known[0], A), 0.0)
    table.merge(Member("x", "x:1", known[0], known[1]), 0.0)
    change = table.merge(Member("x", "x:1", rumour[0], rumour[1]), 1.0)
    assert (change is not None) is accepted
    got = table.get("x")
    assert got is not None
    assert (got.incarnation, got.state) == (rumour if accepted else known)


@pytest.mark.parametrize(
    ("rumour", "incarnation"),
    [((0, S), 1), ((0, D), 1), ((5, A), 6), ((5, S), 6), ((0, A), None)],
    ids=lambda v: f"{v[1].name.lower()}{v[0]}" if isinstance(v, tuple) else str(v),
)
def test_members_rumour_about_self_refuted_with_higher_incarnation(
    rumour: tuple[int, State], incarnation: int | None
) -> None:
    table = MemberTable("me", "me:1", 0.0, 16)
    change = table.merge(Member("me", "me:1", rumour[0], rumour[1]), 1.0)
    if incarnation is None:
        assert change is None
    else:
        assert change is not None and change.member.state is A
        assert table.local.incarnation == incarnation


def test_members_self_at_other_address_refuted() -> None:
    table = MemberTable("me", "new:1", 0.0, 16)
    change = table.merge(Member("me", "old:1", 0, A), 1.0)
    assert change is not None and table.local.incarnation == 1


def test_members_suspect_expires_dead_then_reaped() -> None:
    table = MemberTable("me", "me:1", 0.0, 16)
    table.merge(Member("x", "x:1", 3, A), 0.0)
    assert table.suspect("x", 10.0) is not None
    assert table.expire(12.0, timeout=5.0) == []
    dead = table.expire(15.0, timeout=5.0)
    assert [c.member.state for c in dead] == [D] and dead[0].died
    assert table.reap(20.0, after=30.0) == []
    assert table.reap(46.0, after=30.0) == ["x"]
    assert table.get("x") is None


def test_members_unknown_dead_ignored_and_table_bounded() -> None:
    table = MemberTable("me", "me:1", 0.0, max_members=2)
    assert table.merge(Member("ghost", "g:1", 0, D), 0.0) is None
    assert table.merge(Member("x", "x:1", 0, A), 0.0) is not None
    assert table.merge(Member("y", "y:1", 0, A), 0.0) is None
    assert table.refused == 1


def test_members_probe_order_visits_every_peer_once_per_cycle() -> None:
    table = MemberTable("me", "me:1", 0.0, 16)
    for name in "abcd":
        table.merge(Member(name, f"{name}:1", 0, A), 0.0)
    rng = random.Random(1)
    cycle = [table.next_probe(rng) for _ in range(4)]
    assert sorted(m.id for m in cycle if m) == ["a", "b", "c", "d"]


def test_members_leaving_node_does_not_refute() -> None:
    table = MemberTable("me", "me:1", 0.0, 16)
    assert table.leave(1.0).state is D
    assert table.merge(Member("me", "me:1", 0, S), 2.0) is None


# -- wire --------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name.lower())
def test_wire_member_round_trip_keeps_all_but_since(state: State) -> None:
    m = Member("b", "b:7946", 3, state, since=12.5)
    assert member_from_pb(member_to_pb(m)) == Member("b", "b:7946", 3, state)


@pytest.mark.parametrize(
    "rumour",
    [
        pb.Member(address="b:1", incarnation=1, state=pb.MEMBER_STATE_ALIVE),
        pb.Member(id="b", address="b:1", incarnation=1, state=pb.MEMBER_STATE_UNSPECIFIED),
    ],
    ids=["no_id", "no_state"],
)
def test_wire_member_from_pb_nameless_or_stateless_none(rumour: pb.Member) -> None:
    assert member_from_pb(rumour) is None


# -- auth --------------------------------------------------------------------------------------


def test_sealer_wrong_secret_fails_mac() -> None:
    mac = Sealer(SECRET).mac(b"frame")
    Sealer(SECRET).verify(b"frame", mac)
    with pytest.raises(AuthError) as e:
        Sealer(b"another-secret-0123456").verify(b"frame", mac)
    assert e.value.reason == "mac"
    with pytest.raises(AuthError):
        Sealer(SECRET).verify(b"frame!", mac)


def test_replay_guard_same_nonce_refused() -> None:
    g = ReplayGuard.create(window=30.0, max_entries=100)
    g.check("a", 1, sent=100.0, now=100.0)
    g.check("b", 1, sent=100.0, now=100.0)
    with pytest.raises(AuthError) as e:
        g.check("a", 1, sent=100.0, now=101.0)
    assert e.value.reason == "replay"


@pytest.mark.parametrize("skew", [-31.0, 31.0])
def test_replay_guard_outside_window_stale(skew: float) -> None:
    g = ReplayGuard.create(window=30.0, max_entries=100)
    with pytest.raises(AuthError) as e:
        g.check("a", 1, sent=100.0 + skew, now=100.0)
    assert e.value.reason == "stale"


def test_replay_guard_full_memory_refuses_older_frames() -> None:
    g = ReplayGuard.create(window=30.0, max_entries=3)
    for i in range(5):
        g.check("a", i, sent=100.0 + i, now=105.0)
    assert len(g) == 3
    # Nonce 0 was forgotten; a replay of it (sent at 100) must still be refused.
    with pytest.raises(AuthError):
        g.check("a", 0, sent=100.0, now=105.0)
    g.check("a", 99, sent=105.0, now=105.0)


def test_replay_guard_entries_expire_with_window() -> None:
    g = ReplayGuard.create(window=30.0, max_entries=100)
    g.check("a", 1, sent=100.0, now=100.0)
    g.check("a", 2, sent=140.0, now=140.0)
    assert len(g) == 1


# -- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"secret": None}, "KVROUTER_GOSSIP_SECRET"),
        ({"secret": b"short"}, "at least 16 bytes"),
        ({"node_id": ""}, "node_id"),
        ({"seeds": ("nohost",)}, "seeds[0]"),
        ({"bind": "0.0.0.0:x"}, "bind"),
        ({"tuning": dataclasses.replace(LAN, probe_timeout=2.0)}, "probe_timeout"),
    ],
    ids=["no-auth", "short-secret", "empty-id", "bad-seed", "bad-bind", "timeout-gt-interval"],
)
def test_config_invalid_raises_naming_field(changes: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"node_id": "n", "secret": SECRET}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GossipConfig(**{**base, **changes})  # type: ignore[arg-type]


def test_config_wildcard_bind_needs_advertise() -> None:
    c = GossipConfig(node_id="n", secret=SECRET)
    with pytest.raises(ConfigError, match="advertise"):
        _ = c.advertised
    c = GossipConfig(node_id="n", secret=SECRET, bind="0.0.0.0:7000", advertise="10.1.2.3:7000")
    assert c.advertised == "10.1.2.3:7000"


def test_config_dns_name_defaults_to_own_port() -> None:
    c = GossipConfig(node_id="n", secret=SECRET, bind="0.0.0.0:7100", dns_name="svc.ns")
    assert c.dns_target == ("svc.ns", 7100)


def test_config_secret_from_env_empty_is_none() -> None:
    assert secret_from_env({"KVROUTER_GOSSIP_SECRET": ""}) is None
    assert (
        secret_from_env({"KVROUTER_GOSSIP_SECRET": "s3cret-of-16-bytes"}) == b"s3cret-of-16-bytes"
    )
    assert (
        secret_from_env({"MY_SECRET": "s3cret-of-16-bytes"}, "MY_SECRET") == b"s3cret-of-16-bytes"
    )


def test_config_secret_from_env_too_short_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^MY_SECRET: .* at least 16 bytes, got 6$"):
        secret_from_env({"MY_SECRET": "s3cret"}, "MY_SECRET")


def test_presets_local_faster_than_lan() -> None:
    assert LOCAL.gossip_interval < LAN.gossip_interval
    assert LOCAL.probe_interval < LAN.probe_interval


# -- stores ------------------------------------------------------------------------------------


def _delta(origin: str, seq: int, *keys: int) -> pb.Delta:
    return pb.Delta(origin=origin, seq=seq, engine="e", added=list(keys) or [seq])


def test_delta_store_duplicate_not_new() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=100, max_origins=10)
    assert s.add(_delta("o", 1), wall=0.0)
    assert not s.add(_delta("o", 1), wall=0.0)
    assert s.has("o", 1) and not s.has("o", 2)


def test_delta_store_repair_sends_what_peer_lacks() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=100, max_origins=10)
    for i in range(1, 6):
        s.add(_delta("o", i), wall=0.0)
    r = s.repair({"o": 3}, budget=1 << 20)
    assert [d.seq for d in r.deltas] == [4, 5] and not r.snapshot_advised


def test_delta_store_repair_past_retention_advises_snapshot() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=3, max_origins=10)
    for i in range(1, 11):
        s.add(_delta("o", i), wall=0.0)
    assert s.retained == 3
    r = s.repair({}, budget=1 << 20)
    assert r.snapshot_advised
    assert not s.repair({"o": 7}, budget=1 << 20).snapshot_advised


def test_delta_store_repair_over_budget_advises_snapshot() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=100, max_origins=10)
    for i in range(1, 11):
        s.add(_delta("o", i, *range(100)), wall=0.0)
    r = s.repair({}, budget=2000)
    assert r.snapshot_advised and 0 < len(r.deltas) < 10


def test_delta_store_window_passing_a_gap_marks_origin_skipped() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=16, max_origins=4)
    for seq in (3, 2, 1, 5, 4):  # out of order, no gap left
        s.add(_delta("a", seq, seq), wall=0.0)
    assert s.skipped == set()
    for seq in range(100, 100 + SeqWindow().limit + 1):  # 6..99 never come
        s.add(_delta("b", seq, seq), wall=0.0)
    assert s.skipped == {"b"} and s.floors()["b"] >= 100


def test_delta_store_bytes_bounded_and_origins_bounded() -> None:
    s = DeltaStore(retained_bytes=5000, per_origin=1000, max_origins=4)
    for i in range(1, 200):
        s.add(_delta(f"o{i % 8}", i, *range(50)), wall=0.0)
    assert s.retained_bytes <= 5000
    assert len(s.floors()) <= 4


def test_delta_store_advance_covers_snapshot_floors() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=100, max_origins=10)
    s.add(_delta("o", 12), wall=0.0)
    s.advance({"o": 10, "p": 4})
    assert s.floors() == {"o": 10, "p": 4}
    s.add(_delta("o", 11), wall=0.0)
    assert s.floors()["o"] == 12


def test_delta_store_lag_is_age_at_arrival() -> None:
    s = DeltaStore(retained_bytes=1 << 20, per_origin=100, max_origins=10)
    d = _delta("o", 1)
    d.created_unix_ms = 1_000_000
    s.add(d, wall=1_000.25)
    assert s.lag == {"o": pytest.approx(0.25)}


def test_load_store_keeps_newest_and_expires() -> None:
    s = LoadStore(max_origins=4)
    assert s.offer(pb.LoadReport(origin="a", version=2), now=0.0)
    assert not s.offer(pb.LoadReport(origin="a", version=1), now=0.0)
    assert s.newer_than({"a": 1}) and not s.newer_than({"a": 2})
    assert s.expired(now=10.0, ttl=5.0, keep="me") == ["a"]
    assert len(s) == 0


def test_snapshot_sessions_bounded_and_expire() -> None:
    s = SnapshotSessions(max_sessions=1, ttl=5.0)
    first = s.open(pb.Digest(), [], [[], []], now=0.0)
    assert first.chunks == 2 and not s.has_room(1.0)
    assert s.chunk(first.snapshot_id, 1, now=1.0) is not None
    assert s.has_room(1.0)  # fully served: gone
    second = s.open(pb.Digest(), [], [[]], now=2.0)
    assert s.chunk(second.snapshot_id, 0, now=8.0) is None


# -- index additions and the bridge ------------------------------------------------------------


def _index(name: str = "a") -> BlockIndex:
    return BlockIndex(IndexLimits(engine_capacity_blocks=100), origin=run_origin(name))


def test_bridge_index_origin_local_rejected() -> None:
    with pytest.raises(ValueError, match="run_origin"):
        IndexDelegate(BlockIndex(IndexLimits(engine_capacity_blocks=10)), LoadBook())


def test_bridge_queue_drains_in_order_and_bounded() -> None:
    idx = _index()
    bridge = IndexDelegate(idx, LoadBook(), max_queue=3)
    for k in range(5):
        bridge.queue(idx.confirm("e", [k], 0.0))
    assert bridge.dropped == 2
    assert [d.seq for d in bridge.local_deltas(10)] == [3, 4, 5]
    assert bridge.local_deltas(10) == []


def test_bridge_merge_delta_applies_to_index_once() -> None:
    src, dst = _index("a"), _index("b")
    bridge = IndexDelegate(dst, LoadBook())
    out = IndexDelegate(src, LoadBook())
    out.queue(src.confirm("e", [1, 2, 3], 0.0))
    out.queue(src.remove("e", [3]))
    for d in out.local_deltas(10) * 2:
        bridge.merge_delta(d)
    assert set(dst.export_keys("e")) == {1, 2}
    assert dst.seen() == {src.origin: 2}


def test_bridge_load_report_and_forget() -> None:
    book = LoadBook()
    bridge = IndexDelegate(_index(), book)
    hot = [pb.PrefixHeat(prefix=7, requests=4)]
    bridge.merge_load("peer", [pb.EngineLoad(engine="e", requests=2, tokens=30)], hot)
    assert book.total("e") == Load(2, 30)
    assert book.heat(7) == 4
    bridge.forget_load("peer")
    assert book.total("e") == Load(0, 0)
    assert book.heat(7) == 0


def test_bridge_heat_reported_hottest_first_and_taken_bounded() -> None:
    book = LoadBook()
    for prefix in range(HOT_PREFIXES + 10):
        for _ in range(prefix % 5 + 1):
            book.acquire("e", 0, prefix=prefix)
    bridge = IndexDelegate(_index(), book)
    sent = bridge.local_heat()
    assert len(sent) == HOT_PREFIXES
    assert min(h.requests for h in sent) >= max(
        n for k, n in book.hottest(HOT_PREFIXES + 10).items() if k not in {h.prefix for h in sent}
    )
    # A peer sending more than its share is cut to the cap.
    flood = [pb.PrefixHeat(prefix=k, requests=1) for k in range(1000, 1000 + 10 * HOT_PREFIXES)]
    bridge.merge_load("peer", [], flood)
    assert sum(book.heat(k) for k in range(1000, 1000 + 10 * HOT_PREFIXES)) == HOT_PREFIXES


def test_bridge_local_load_from_book() -> None:
    book = LoadBook()
    book.acquire("e2", 5)
    book.acquire("e1", 7)
    loads = IndexDelegate(_index(), book).local_load()
    assert [(x.engine, x.requests, x.tokens) for x in loads] == [("e1", 1, 7), ("e2", 1, 5)]


def test_bridge_snapshot_round_trip_keeps_keys_and_recency() -> None:
    src, dst = _index("a"), _index("b")
    for i in range(50):
        src.confirm(f"e{i % 3}", [i * 10 + j for j in range(7)], float(i))
    src.add_engine("idle")
    parts = list(IndexDelegate(src, LoadBook()).export_blocks(chunk_bytes=4096 + 8 * 40))
    assert len(parts) > 3
    into = IndexDelegate(dst, LoadBook())
    for part in parts:
        into.restore_blocks(part)
    for e in src.engines:
        assert dst.export_keys(e) == src.export_keys(e)
    assert len(dst) == len(src)


def test_index_mark_seen_skips_covered_deltas() -> None:
    src, dst = _index("a"), _index("b")
    deltas = [src.confirm("e", [i], 0.0) for i in range(1, 6)]
    dst.mark_seen(src.origin, 3)
    applied = [dst.apply(d, 0.0) for d in deltas]
    assert applied == [False, False, False, True, True]


# -- stats and code generation -----------------------------------------------------------------


def test_stats_samples_named_kvrouter_gossip() -> None:
    from router.gossip.stats import Counters, GossipStats

    st = GossipStats(
        "n", Counters(bytes_in=5), {"alive": 2, "suspect": 0, "dead": 1}, {"o": 0.2}, 0, 0, 0
    )
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(st)}
    assert got[("kvrouter_gossip_peers", (("state", "dead"),))] == 1
    assert got[("kvrouter_gossip_bytes_total", (("direction", "in"),))] == 5
    assert got[("kvrouter_gossip_convergence_lag_seconds", (("origin", "o"),))] == 0.2
    assert all(s.name.startswith("kvrouter_gossip_") for s in samples(st))
