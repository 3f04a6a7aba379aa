"""Replicas whose clocks disagree: tolerated inside the replay window, refused beyond it, and
said so in the log, naming the peer and the skew (virtual time; no wall clock read)."""

from __future__ import annotations

import logging

import pytest

from router.core.fields import ConfigError
from router.core.load import Load
from router.gateway.replicas.in_process import Fleet, Replica
from router.gossip.auth import AuthError, ReplayGuard
from router.gossip.clock import TEST_SKEW_ENV, ManualClock, SkewedClock, SystemClock, system_clock
from router.gossip.config import LOCAL
from router.gossip.skew import SkewWatch
from router.gossip.stats import samples

WINDOW = LOCAL.replay_window


def test_replay_guard_stale_frame_names_sender_and_skew() -> None:
    g = ReplayGuard.create(window=30.0, max_entries=10)
    with pytest.raises(AuthError) as e:
        g.check("b", 1, sent=400.0, now=100.0)
    assert (e.value.reason, e.value.sender, e.value.skew) == ("stale", "b", 300.0)
    assert "+300.0s" in str(e.value)


def test_skew_watch_within_a_third_of_the_window_silent() -> None:
    w = SkewWatch(window=30.0, max_peers=8)
    assert w.observe("b", 9.9, now=0.0) is None
    assert w.observe("b", -9.9, now=1.0) is None
    assert w.skews["b"] == -9.9


def test_skew_watch_beyond_the_window_refused_line_names_peer_and_skew() -> None:
    w = SkewWatch(window=30.0, max_peers=8)
    line = w.observe("b", -300.0, now=0.0)
    assert line is not None and "refusing b" in line and "-300.0s" in line and "30s" in line


def test_skew_watch_tolerated_warned_then_quiet_then_again_on_refusal_or_after_a_while() -> None:
    w = SkewWatch(window=30.0, max_peers=8, every=60.0)
    line = w.observe("b", 12.0, now=0.0)
    assert line is not None and "tolerated" in line and "+12.0s" in line
    assert w.observe("b", 13.0, now=1.0) is None
    assert w.observe("b", 31.0, now=2.0) is not None  # refused now: said at once
    assert w.observe("b", 32.0, now=3.0) is None
    assert w.observe("b", 32.0, now=62.5) is not None  # still refused, a minute on


def test_skew_watch_peers_bounded() -> None:
    w = SkewWatch(window=30.0, max_peers=4)
    for i in range(100):
        w.observe(f"peer-{i}", 50.0, now=float(i))
        assert w.due(f"refused by {i}", now=float(i))
    assert len(w.skews) == 4
    assert len(w._logged) == 4


def test_system_clock_test_variable_skews_wall_time_only() -> None:
    assert isinstance(system_clock({}), SystemClock)
    clock = system_clock({TEST_SKEW_ENV: "-300"})
    assert isinstance(clock, SkewedClock) and clock.skew == -300.0
    base = ManualClock(start=5.0, wall_start=1000.0)
    skewed = SkewedClock(120.0, base)
    assert (skewed.now(), skewed.wall()) == (5.0, 1120.0)


@pytest.mark.parametrize("value", ["soon", "nan", "inf"])
def test_system_clock_test_variable_not_a_number_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match=TEST_SKEW_ENV):
        system_clock({TEST_SKEW_ENV: value})


def refused_stale(replica: Replica) -> float:
    return sum(
        s.value
        for s in samples(replica.node.stats())
        if s.name == "kvrouter_gossip_refused_total" and s.labels["reason"] == "stale"
    )


def alive(replica: Replica) -> int:
    return replica.node.stats().peers["alive"]


async def test_fleet_replica_minutes_off_refused_both_ways_logged_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    f = Fleet(clock=clock)
    try:
        rs = await f.start(2)
        assert await f.settle(lambda: all(alive(r) == 1 for r in rs), limit=2.0)
        caplog.set_level(logging.WARNING, logger="router.gossip.node")
        wrong = await f.add("wrong", clock=SkewedClock(-180.0, clock))
        wrong.loads.acquire("e", 5)
        wrong.record("e", [7])
        await clock.advance(3.0)
        # Never a member, nothing it says is merged, and the fleet carries on as it was.
        assert all(alive(r) == 1 for r in rs) and alive(wrong) == 0
        assert all(r.contents() == {} and r.loads.total("e") == Load() for r in rs)
        assert sum(refused_stale(r) for r in rs) > 0 and refused_stale(wrong) > 0
        lines = [r.getMessage() for r in caplog.records]
        assert any("refusing wrong" in x and "-180.0s" in x for x in lines), lines
        # The wrong replica's own log says who refuses it, and why.
        assert any("a message from wrong was refused" in x and "stale" in x for x in lines)
        # Each peer is named once, not once per message.
        assert sum("refusing wrong" in x and "(seen by r0)" in x for x in lines) == 1
    finally:
        await f.close()


async def test_fleet_replica_seconds_off_tolerated_joins_shares_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    f = Fleet(clock=clock)
    try:
        caplog.set_level(logging.WARNING, logger="router.gossip.node")
        rs = await f.start(2)
        late = await f.add("late", clock=SkewedClock(WINDOW / 2, clock))
        everyone = [*rs, late]
        assert await f.settle(lambda: all(alive(r) == 2 for r in everyone), limit=3.0)
        late.loads.acquire("e", 5)
        late.record("e", [7])
        assert await f.settle(
            lambda: all(r.contents() == {"e": frozenset({7})} for r in everyone), 2.0
        )
        assert await f.settle(lambda: all(r.loads.total("e") == Load(1, 5) for r in rs), 2.0)
        assert sum(refused_stale(r) for r in everyone) == 0
        lines = [r.getMessage() for r in caplog.records]
        assert any("late's clock is +15.0s" in x and "tolerated" in x for x in lines), lines
    finally:
        await f.close()
