"""The KV-event subscriber: one ZMQ SUB per engine, feeding the engines' own word to the index.

Each engine with an event endpoint (``kv_events.endpoints``, or the port rule applied to its
host) gets one task that subscribes, reconnects forever with capped backoff, and hands every
batch to ``Feed`` (router.core.kv_events decodes it; ``RoutingCore.observe`` applies it).

Sequence numbers are checked per engine. A gap asks the engine's replay endpoint (a DEALER
sends ``[b"", start_seq]``; a ROUTER answers each buffered batch, then an end marker, in
either framing) for the missing batches; when the replay cannot cover the gap, or there is no
replay endpoint, the engine is *degraded*: its event entries are dropped and it is routed on
approximate keys until its cache is cleared (``AllBlocksCleared``) or it restarts. A sequence
starting again from 0 (a restarted engine) and an engine readmitted after ejection clear what
is known of it (``RoutingCore.forget``). The first batch of a new subscription asks for the
replay of everything still buffered, so a router started late learns what engines hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from router.core.decision import RoutingCore
from router.core.engine_blocks import EngineBlocks
from router.core.kv_events import (
    Batch,
    BlockStored,
    Counts,
    Malformed,
    decode_batch,
    split_message,
    split_replay,
)
from router.gateway.config.engines import KvEventsSettings

log = logging.getLogger(__name__)

BACKOFF_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
POLL_MS = 500
# Batches applied per wake-up of a subscription before the loop serves others (a batch of a
# long prompt costs a few ms to decode and key: 16 stay well under a decision's budget of
# patience, and keep up with an engine publishing 16 batches in one turn of the loop).
DRAIN_BATCHES = 16
REPLAY_TIMEOUT_SECONDS = 2.0
# Engine hashes remembered per engine (for removals and parent links): about 100 bytes each.
MAX_HASHES = 1_000_000
# An engine is blind (Feed.blind) when most of its latest ORPHAN_WINDOW stores, and at least
# ORPHAN_MIN of them, hang from blocks this router never saw.
ORPHAN_WINDOW = 64
ORPHAN_MIN = 8
CATCH_UP_UNTIL = 1 << 62
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30)


def endpoints_for(cfg: KvEventsSettings, engines: list[str]) -> dict[str, tuple[str, str | None]]:
    """Per engine URL: its event endpoint and replay endpoint (explicit, else the port rule)."""
    out: dict[str, tuple[str, str | None]] = {}
    for url in engines:
        explicit = cfg.endpoints.get(url)
        if explicit is not None:
            out[url] = (explicit.endpoint, explicit.replay_endpoint or None)
        elif cfg.port:
            host = urlsplit(url).hostname or ""
            host = f"[{host}]" if ":" in host else host
            replay = f"tcp://{host}:{cfg.replay_port}" if cfg.replay_port else None
            out[url] = (f"tcp://{host}:{cfg.port}", replay)
    return out


def sharing(wanted: Mapping[str, tuple[str, str | None]]) -> dict[str, list[str]]:
    """Event endpoints named for more than one engine, with those engines' URLs.

    One publisher's events cannot be told apart by engine: subscribed for each, they would
    credit every one of them with blocks only one holds. Engines sharing a host need their own
    endpoints (``kv_events.endpoints``, ``--kv-events URL=...``), not the port rule.
    """
    by_endpoint: dict[str, list[str]] = {}
    for url, (endpoint, _replay) in wanted.items():
        by_endpoint.setdefault(endpoint, []).append(url)
    return {ep: sorted(urls) for ep, urls in by_endpoint.items() if len(urls) > 1}


class EventMetrics:
    """The kvrouter_kv_* and kvrouter_tokenize_* series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.events = Counter(
            "kvrouter_kv_events", "KV cache events received, by engine and type.",
            ["backend", "type"], registry=r,
        )  # fmt: skip
        self.dropped = Counter(
            "kvrouter_kv_events_dropped",
            "Batches or events dropped (malformed, unknown, orphaned), by engine and reason.",
            ["backend", "reason"], registry=r,
        )  # fmt: skip
        self.gaps = Counter(
            "kvrouter_kv_event_gaps", "Gaps in an engine's event sequence.", ["backend"],
            registry=r,
        )  # fmt: skip
        self.replays = Counter(
            "kvrouter_kv_event_replays", "Replay requests, by engine and result.",
            ["backend", "result"], registry=r,
        )  # fmt: skip
        self.degraded = Gauge(
            "kvrouter_kv_events_degraded_backends",
            "Engines whose events are incomplete (routed on approximate keys).", registry=r,
        )  # fmt: skip
        self.lag = Histogram(
            "kvrouter_kv_event_lag_seconds",
            "From the engine's batch timestamp to its arrival, live batches only (clocks of two "
            "hosts).",
            buckets=LAG_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokenize = Histogram(
            "kvrouter_tokenize_seconds",
            "Time to get a prompt's token ids (from an engine, or the local tokenizer).",
            buckets=LAG_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokenize_failures = Counter(
            "kvrouter_tokenize_failures",
            "Tokenizations that failed or timed out (the request used text keys).", registry=r,
        )  # fmt: skip
        self.entries = Gauge(
            "kvrouter_index_entries", "Index entries by source (event, approximate, predicted).",
            ["source"], registry=r,
        )  # fmt: skip


@dataclass
class Feed:
    """One engine's event stream: sequence, engine-hash map, degraded state (no I/O)."""

    engine: str
    core: RoutingCore
    metrics: EventMetrics | None = None
    blocks: EngineBlocks = field(default_factory=lambda: EngineBlocks(MAX_HASHES))
    counts: Counts = field(default_factory=Counts)
    last_seq: int | None = None
    degraded: bool = False
    # The latest BlockStored events: True for each orphan (its parent never seen here).
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=ORPHAN_WINDOW))

    @property
    def blind(self) -> bool:
        """Most new blocks hang from blocks this router never saw: it subscribed later than
        the engine could replay, and the chains stored before (a shared system prompt, a
        template's preamble) cannot be keyed. Its events then miss most of what the engine
        holds, and text keys serve better, until it stores whole chains again."""
        r = self.recent
        return len(r) >= ORPHAN_MIN and 2 * sum(r) > len(r)

    def _count(self, before: Counts, orphans: int) -> None:
        m = self.metrics
        if m is None:
            return
        for kind, n in self.counts.events.items():
            if n - before.events.get(kind, 0):
                m.events.labels(self.engine, kind).inc(n - before.events.get(kind, 0))
        for reason, n in (
            ("malformed", self.counts.malformed - before.malformed),
            ("unknown_event", self.counts.unknown_events - before.unknown_events),
            ("orphan", self.blocks.orphans - orphans),
        ):
            if n:
                m.dropped.labels(self.engine, reason).inc(n)

    def apply(self, payload: bytes, now: float, *, live: bool = True) -> Batch | None:
        """Decode one batch and apply it to the index; None when it was dropped.

        Only a ``live`` batch (not a replayed one) times the lag: a replay at start-up brings
        minutes of history, which would bury the delivery delay a lag dashboard is for.
        """
        c = self.counts
        before = Counts(c.batches, dict(c.events), c.malformed, c.unknown_events, c.unknown_fields)
        orphans = self.blocks.orphans
        batch = decode_batch(payload, c)
        blind = self.blind
        if batch is not None:
            for event in batch.events:
                before_event = self.blocks.orphans
                change = self.blocks.apply(event)
                if isinstance(event, BlockStored):
                    self.recent.append(self.blocks.orphans > before_event)
                if change is None:
                    continue
                if change.cleared and self.degraded:
                    self.degraded = False  # a clean slate: the events are complete again
                if not self.degraded:
                    self.core.observe(self.engine, change, now)
            if live and self.metrics is not None:
                self.metrics.lag.observe(max(0.0, time.time() - batch.ts))
        self._count(before, orphans)
        if self.blind != blind:
            if self.blind:
                log.warning(
                    "KV events of %s: most new blocks hang from blocks this router never saw "
                    "(it started later than the engine can replay): routing it on approximate "
                    "keys until it stores whole chains again",
                    self.engine,
                )
            else:
                log.info("KV events of %s are whole again", self.engine)
        self._precise()
        return batch

    def _precise(self) -> None:
        size = None if self.degraded or self.blind else self.blocks.block_size
        self.core.set_precise(self.engine, size)

    def restart(self) -> None:
        """The engine restarted (or came back): nothing it held is known to survive."""
        self.core.forget(self.engine)
        self.blocks.clear()
        self.recent.clear()
        self.degraded = False
        self.last_seq = None
        self._precise()

    def degrade(self) -> None:
        """Events were lost for good: approximate keys until a clear or a restart."""
        if not self.degraded:
            log.warning(
                "KV events of %s are incomplete: routing it on approximate keys", self.engine
            )
        self.degraded = True
        self.core.index.clear_events(self.engine)
        self.blocks.clear()
        self.recent.clear()
        self._precise()


class Subscriber:
    """One task per engine with an event endpoint; the app's cleanup_ctx runs ``run``."""

    def __init__(
        self,
        core: RoutingCore,
        cfg: KvEventsSettings,
        engines: Callable[[], Mapping[str, bool]],
        metrics: EventMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.cfg = cfg
        self.engines = engines  # url -> healthy
        self.metrics = metrics
        self.clock = clock
        self.feeds: dict[str, Feed] = {}
        self._ctx = zmq.asyncio.Context()
        self._shared: set[str] = set()  # endpoints already warned of (``sharing``)

    def _degraded_gauge(self) -> None:
        self.metrics.degraded.set(sum(1 for f in self.feeds.values() if f.degraded or f.blind))

    async def run(self) -> None:
        """Keep one subscription per engine with an endpoint, forever."""
        tasks: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                wanted = self.wanted()
                for url in set(tasks) - set(wanted):
                    tasks.pop(url).cancel()
                    self.feeds.pop(url, None)
                    self.core.set_precise(url, None)
                for url, (ep, replay) in wanted.items():
                    if url not in tasks:
                        feed = self.feeds[url] = Feed(url, self.core, self.metrics)
                        tasks[url] = asyncio.create_task(
                            self._subscribe(feed, ep, replay), name=f"kv-events {url}"
                        )
                await asyncio.sleep(1.0)
        finally:
            for t in tasks.values():
                t.cancel()
            for t in tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            self.close()

    def wanted(self) -> dict[str, tuple[str, str | None]]:
        """The engines to subscribe to, less those sharing an endpoint (warned of once)."""
        wanted = endpoints_for(self.cfg, list(self.engines()))
        for endpoint, urls in sharing(wanted).items():
            if endpoint not in self._shared:
                self._shared.add(endpoint)
                log.warning(
                    "KV events: engines %s all map to %s; routing them on approximate keys. "
                    "Engines that share a host need their own endpoints (--kv-events URL=...)",
                    ", ".join(urls), endpoint,
                )  # fmt: skip
            for url in urls:
                del wanted[url]
        return wanted

    def close(self) -> None:
        """Release the ZMQ context (``run`` does it when it stops)."""
        self._ctx.term()

    async def _subscribe(self, feed: Feed, endpoint: str, replay: str | None) -> None:
        backoff = BACKOFF_SECONDS
        topic = self.cfg.topic.encode()
        seen_healthy = down = False  # a flap: healthy, then not, then healthy again
        while True:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, topic)
            try:
                sock.connect(endpoint)
                if feed.last_seq is None and replay is not None:
                    await self._catch_up(feed, replay)
                while True:
                    if self.engines().get(feed.engine, False):
                        if down:
                            log.info("%s is back: forgetting what it held", feed.engine)
                            feed.restart()
                        seen_healthy, down = True, False
                    elif seen_healthy:
                        down = True
                    if not await sock.poll(POLL_MS):
                        continue
                    backoff = BACKOFF_SECONDS
                    await self._drain(sock, feed, replay)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV events of %s: subscription failed; reconnecting", feed.engine)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, BACKOFF_MAX_SECONDS)
            finally:
                sock.close(0)

    async def _drain(self, sock: zmq.asyncio.Socket, feed: Feed, replay: str | None) -> None:
        """Apply the batches waiting on ``sock``, up to ``DRAIN_BATCHES`` in one turn of the
        event loop. One batch per wake-up (a poll and a receive, two turns of a loop busy
        with requests) fell behind a fleet publishing a batch per request: events arrived
        seconds late, and the index believed in blocks engines had already evicted."""
        for _ in range(DRAIN_BATCHES):
            try:
                frames = await sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            await self._message(feed, frames, replay)

    async def _message(self, feed: Feed, frames: list[bytes], replay: str | None) -> None:
        try:
            _topic, seq, payload = split_message(frames)
        except Malformed:
            self.metrics.dropped.labels(feed.engine, "malformed").inc()
            return
        now = self.clock()
        last = feed.last_seq
        if last is not None and seq <= last:
            if seq != 0 or last == 0:
                return  # a duplicate (a replayed batch seen again)
            log.info("%s restarted its event sequence: forgetting what it held", feed.engine)
            feed.restart()
            last = None
        expected = 0 if last is None else last + 1
        if seq > expected:
            if last is not None:
                self.metrics.gaps.labels(feed.engine).inc()
            missing = await self._replay(feed, replay, expected, seq)
            if missing is None:
                if last is not None:
                    feed.degrade()
            else:
                for _, p in missing:
                    feed.apply(p, now, live=False)
        feed.last_seq = seq
        feed.apply(payload, now)
        self._degraded_gauge()

    async def _catch_up(self, feed: Feed, replay: str) -> None:
        """A new subscription: replay whatever the engine still buffers, from the start."""
        got = await self._replay(feed, replay, 0, CATCH_UP_UNTIL)
        now = self.clock()
        for seq, payload in got or ():
            feed.apply(payload, now, live=False)
            feed.last_seq = seq

    async def _replay(
        self, feed: Feed, endpoint: str | None, start: int, until: int
    ) -> list[tuple[int, bytes]] | None:
        """Batches ``start`` to ``until - 1`` from the replay endpoint; None when not all came."""
        if endpoint is None:
            self.metrics.replays.labels(feed.engine, "unavailable").inc()
            return None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: dict[int, bytes] = {}
        ended = False  # the end marker came: the engine sent all it still buffers
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            async with asyncio.timeout(REPLAY_TIMEOUT_SECONDS):
                while True:
                    item = split_replay(await sock.recv_multipart())
                    if item is None:
                        ended = True
                        break
                    if start <= item[0] < until:
                        got[item[0]] = item[1]
        except (TimeoutError, Malformed, zmq.ZMQError) as e:
            log.warning("replay of %s's events failed: %s", feed.engine, e)
        finally:
            sock.close(0)
        # A catch-up asks for everything buffered: complete when the end marker came, even
        # with nothing in between (an engine that has published nothing yet).
        complete = ended if until == CATCH_UP_UNTIL else len(got) == until - start
        self.metrics.replays.labels(feed.engine, "complete" if complete else "partial").inc()
        if not complete and start > 0:
            return None
        return sorted(got.items())  # from 0: whatever is still buffered helps
