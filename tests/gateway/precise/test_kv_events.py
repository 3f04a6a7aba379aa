"""The KV-event subscriber's sequence rules: gaps, replays, degraded engines, restarts.

Batches come from engine-sim's own event writer (router.enginesim.kv_publisher.CacheEvents);
the replay endpoint, where one is needed, is a real engine-sim publisher on loopback.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from router.core.decision import RoutingCore
from router.enginesim.kv_publisher import CacheEvents, EventSettings, Publisher
from router.gateway.config.engines import KvEventEndpoint, KvEventsSettings
from router.gateway.precise.kv_events import (
    DRAIN_BATCHES,
    ORPHAN_MIN,
    ORPHAN_WINDOW,
    EventMetrics,
    Feed,
    Subscriber,
    endpoints_for,
)
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.support import free_port

ENGINE = "http://127.0.0.1:9000"


@contextlib.contextmanager
def subscriber() -> Iterator[Subscriber]:
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    core.set_engines({ENGINE: 1})
    sub = Subscriber(
        core, KvEventsSettings(), lambda: {ENGINE: True}, EventMetrics(CollectorRegistry())
    )
    try:
        yield sub
    finally:
        sub.close()


def ids_of(ids: Sequence[int]) -> Callable[[int, int], Sequence[int]]:
    """A prompt's ids as ``CacheEvents.admitted`` asks for them: ``start`` to ``end``."""
    return lambda start, end: ids[start:end]


def frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


def stored(writer: CacheEvents, first_key: int) -> bytes:
    keys = list(range(first_key, first_key + 2))
    return writer.batch(writer.admitted(keys, ids_of(range(first_key, first_key + 8)), 0.0), 1.0)


async def test_gap_without_replay_degrades_until_cleared() -> None:
    with subscriber() as sub:
        feed = sub.feeds[ENGINE] = Feed(ENGINE, sub.core)
        w = CacheEvents(100, 4, "map", "int")
        await sub._message(feed, frames(0, stored(w, 1)), None)
        assert sub.core.precise == {ENGINE: 4} and sub.core.index.event_blocks(ENGINE) == 2
        await sub._message(feed, frames(2, stored(w, 10)), None)  # seq 1 never came
        degraded = feed.degraded
        assert degraded and ENGINE not in sub.core.precise
        assert sub.core.index.event_blocks(ENGINE) == 0
        await sub._message(feed, frames(3, w.batch(w.cleared(), 1.0)), None)
        assert not feed.degraded and sub.core.precise == {ENGINE: 4}


async def test_stores_hanging_from_unseen_blocks_make_the_engine_blind_until_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A router that subscribed after the engine stored a shared root (and could not replay
    it) cannot key what hangs from it: while most new stores do, the engine is routed on text
    keys (and counted as degraded), and it is precise again once whole chains dominate."""
    with subscriber() as sub, caplog.at_level(logging.INFO):
        feed = sub.feeds[ENGINE] = Feed(ENGINE, sub.core, EventMetrics(CollectorRegistry()))
        w = CacheEvents(10_000, 4, "map", "int")
        w.batch(w.admitted([1, 2], ids_of(range(8)), 0.0), 1.0)  # seq 0: before it came
        seq = 1

        def turn(keys: list[int], first_id: int) -> bytes:
            ids = ids_of(range(first_id, first_id + 4 * len(keys)))
            return w.batch(w.admitted(keys, ids, 0.0), 1.0)

        await sub._message(feed, frames(seq, turn([500, 501], 5_000)), None)  # a whole chain
        seq += 1
        assert sub.core.precise == {ENGINE: 4}
        for i in range(ORPHAN_MIN + 2):  # new blocks under the unseen root: orphans
            await sub._message(feed, frames(seq, turn([1, 2, 100 + i], 0)), None)
            seq += 1
        assert ENGINE not in sub.core.precise  # blind: routed on its text keys
        assert feed.recent.count(True) == ORPHAN_MIN + 2
        for i in range(ORPHAN_WINDOW):  # whole chains from their roots: keyed again
            chain = turn([1000 + 2 * i, 1001 + 2 * i], 10_000 + 8 * i)
            await sub._message(feed, frames(seq, chain), None)
            seq += 1
        assert sub.core.precise == {ENGINE: 4} and feed.recent.count(True) < ORPHAN_WINDOW // 2
        logged = [r.getMessage() for r in caplog.records if ENGINE in r.getMessage()]
        assert any("never saw" in m for m in logged) and any("whole again" in m for m in logged)


async def test_sequence_from_zero_again_forgets_the_engine() -> None:
    with subscriber() as sub:
        feed = sub.feeds[ENGINE] = Feed(ENGINE, sub.core)
        w = CacheEvents(100, 4, "array", "bytes")
        for seq in range(3):
            await sub._message(feed, frames(seq, stored(w, 10 * seq + 1)), None)
        assert sub.core.index.event_blocks(ENGINE) == 6
        await sub._message(feed, frames(1, stored(w, 1)), None)  # a duplicate: ignored
        assert sub.core.index.event_blocks(ENGINE) == 6
        restarted = CacheEvents(100, 4, "array", "bytes")
        await sub._message(feed, frames(0, stored(restarted, 50)), None)
        assert sub.core.index.event_blocks(ENGINE) == 2 and not feed.degraded


async def test_gap_covered_by_replay_is_filled_in_order() -> None:
    port, replay = free_port(), free_port()
    pub = Publisher(EventSettings(port=port, replay_port=replay))
    pub.start()
    try:
        with subscriber() as sub:
            w = CacheEvents(100, 4, "map", "int")
            feed = sub.feeds[ENGINE] = Feed(ENGINE, sub.core)
            batches = [w.admitted([k, k + 1], ids_of(range(k, k + 8)), 0.0) for k in (1, 10, 20)]
            for events in batches:
                pub.publish(events)
            payloads = [w.batch(e, 1.0) for e in batches]
            endpoint = f"tcp://127.0.0.1:{replay}"
            await sub._message(feed, frames(0, payloads[0]), endpoint)
            await sub._message(feed, frames(2, payloads[2]), endpoint)
            assert not feed.degraded and feed.last_seq == 2
            assert sub.core.index.event_blocks(ENGINE) == 6  # the replayed seq 1 too
    finally:
        await pub.close()


class Queued:
    """A SUB socket's receiving side holding ``messages``: ``zmq.Again`` once they are out."""

    def __init__(self, messages: list[list[bytes]]) -> None:
        self.messages = deque(messages)

    async def recv_multipart(self, flags: int = 0) -> list[bytes]:
        assert flags & zmq.NOBLOCK
        if not self.messages:
            raise zmq.Again()
        return self.messages.popleft()


async def test_batches_waiting_are_applied_in_one_wake_up() -> None:
    # A fleet publishes a batch per request; applying one per wake-up of a busy loop fell
    # seconds behind. What waits is applied at once, up to DRAIN_BATCHES, then others run.
    with subscriber() as sub:
        w = CacheEvents(1000, 4, "map", "int")
        feed = sub.feeds[ENGINE] = Feed(ENGINE, sub.core)
        n = DRAIN_BATCHES + 3
        queued = Queued([frames(k, stored(w, 10 * k + 1)) for k in range(n)])
        sock = cast(zmq.asyncio.Socket, queued)
        await sub._drain(sock, feed, None)
        assert feed.last_seq == DRAIN_BATCHES - 1 and len(queued.messages) == 3
        await sub._drain(sock, feed, None)
        assert feed.last_seq == n - 1 and not queued.messages
        assert sub.core.index.event_blocks(ENGINE) == 2 * n and not feed.degraded


def test_endpoints_explicit_win_over_the_port_rule() -> None:
    cfg = KvEventsSettings(
        port=5557,
        replay_port=5558,
        endpoints={"http://10.0.0.2:8000": KvEventEndpoint("tcp://10.9.9.9:1")},
    )
    got = endpoints_for(cfg, ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[::1]:80"])
    assert got == {
        "http://10.0.0.1:8000": ("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"),
        "http://10.0.0.2:8000": ("tcp://10.9.9.9:1", None),
        "http://[::1]:80": ("tcp://[::1]:5557", "tcp://[::1]:5558"),
    }
    assert endpoints_for(KvEventsSettings(), ["http://10.0.0.1:8000"]) == {}


def test_engines_sharing_an_endpoint_are_not_subscribed(caplog: pytest.LogCaptureFixture) -> None:
    """The port rule on two engines of one host names one publisher twice: its events would
    credit both engines, so neither is subscribed, and the log says why (once)."""
    a, b, c = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://10.0.0.3:8000"
    cfg = KvEventsSettings(port=5557, endpoints={c: KvEventEndpoint("tcp://10.0.0.3:5557")})
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    engines = dict.fromkeys([a, b, c], True)
    sub = Subscriber(core, cfg, lambda: engines, EventMetrics(CollectorRegistry()))
    try:
        with caplog.at_level(logging.WARNING):
            assert sub.wanted() == {c: ("tcp://10.0.0.3:5557", None)}
            assert sub.wanted() == {c: ("tcp://10.0.0.3:5557", None)}
        warned = [r.getMessage() for r in caplog.records if "all map to" in r.getMessage()]
        assert warned == [
            f"KV events: engines {a}, {b} all map to tcp://127.0.0.1:5557; routing them on "
            "approximate keys. Engines that share a host need their own endpoints "
            "(--kv-events URL=...)"
        ]
    finally:
        sub.close()


async def test_catch_up_of_an_engine_with_nothing_buffered_is_complete() -> None:
    port, replay = free_port(), free_port()
    pub = Publisher(EventSettings(port=port, replay_port=replay))
    pub.start()
    registry = CollectorRegistry()
    try:
        with subscriber() as sub:
            sub.metrics = EventMetrics(registry)
            feed = Feed(ENGINE, sub.core, sub.metrics)
            await sub._catch_up(feed, f"tcp://127.0.0.1:{replay}")
            assert feed.last_seq is None
    finally:
        await pub.close()
    labels = {"backend": ENGINE}
    replays = "kvrouter_kv_event_replays_total"
    assert registry.get_sample_value(replays, {**labels, "result": "complete"}) == 1
    assert registry.get_sample_value(replays, {**labels, "result": "partial"}) is None


async def test_replayed_batches_do_not_time_the_lag_live_ones_do() -> None:
    port, replay = free_port(), free_port()
    pub = Publisher(EventSettings(port=port, replay_port=replay))
    pub.start()
    registry = CollectorRegistry()
    try:
        with subscriber() as sub:
            sub.metrics = EventMetrics(registry)
            feed = Feed(ENGINE, sub.core, sub.metrics)
            w = CacheEvents(100, 4, "map", "int")
            for k in (1, 10, 20):
                pub.publish(w.admitted([k, k + 1], ids_of(range(k, k + 8)), 0.0))
            await sub._catch_up(feed, f"tcp://127.0.0.1:{replay}")
            assert feed.last_seq == 2 and sub.core.index.event_blocks(ENGINE) == 6
            lag = "kvrouter_kv_event_lag_seconds_count"
            assert registry.get_sample_value(lag) == 0
            live = w.batch(w.admitted([30, 31], ids_of(range(30, 38)), 0.0), 1.0)
            await sub._message(feed, frames(3, live), f"tcp://127.0.0.1:{replay}")
            assert registry.get_sample_value(lag) == 1
    finally:
        await pub.close()
