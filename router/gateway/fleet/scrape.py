"""The load engines report of themselves: their Prometheus /metrics, scraped and parsed.

``parse_report`` is pure: exposition bytes -> ``EngineReport`` (requests running, requests
waiting, KV cache in use), reading the series ``MetricNames`` lists (vLLM, SGLang and
llama.cpp by default). Only the lines of those series reach prometheus-client's parser: a
vLLM scrape is mostly histograms the router never reads, and parsing them all every half
second for every engine would cost more CPU than routing. Input it cannot read raises
``MetricsParseError`` and nothing else.

``EngineMetricsScraper.run`` is the background loop the app owns: every interval it GETs each
healthy engine's /metrics through the gateway's ``Upstream`` (each within the timeout, all at
once) and hands the report, stamped with the time the scrape was sent, to the routing core's
``LoadBook.engine_report``. A failed scrape changes nothing: the last report ages out and the
router's own figures take over (``router.core.load``).

``parse_capacity`` reads how many tokens an engine's prefix cache holds, where it says so: the
index then forgets that engine's blocks when the engine does, not at the policy's guess. It
is read from the first scrape and again every ``CAPACITY_REFRESH_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

from router.core.load import EngineReport
from router.gateway.config.engines import EngineMetricsSettings, MetricNames
from router.gateway.openai.errors import UpstreamError
from router.gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

PATH = "/metrics"
# More than any engine's real /metrics; a larger body is cut here, not parsed whole.
MAX_BYTES = 4 * 1024 * 1024
# Request counts above this are nonsense from a broken exporter, not load.
MAX_REQUESTS = 1_000_000

Sink = Callable[[str, EngineReport, float], None]
# How often an engine's cache size is read again (it changes only when the engine restarts).
CAPACITY_REFRESH_SECONDS = 60.0
# Larger is a broken exporter: no engine caches a trillion tokens.
MAX_CAPACITY_TOKENS = 10**12
# vLLM's info gauge carries the cache's shape in its labels; SGLang exports the size in
# tokens, Dynamo's frontend the blocks and their size.
_VLLM_INFO = "vllm:cache_config_info"
_SGLANG_TOKENS = "sglang:max_total_num_tokens"
_DYNAMO_BLOCKS = "dynamo_frontend_model_total_kv_blocks"
_DYNAMO_BLOCK_SIZE = "dynamo_frontend_model_kv_cache_block_size"
_CAPACITY_NAMES = frozenset({_VLLM_INFO, _SGLANG_TOKENS, _DYNAMO_BLOCKS, _DYNAMO_BLOCK_SIZE})


class MetricsParseError(ValueError):
    """Bytes that are not Prometheus text with the load series; the message says why."""


def _wanted_lines(text: str, names: frozenset[str]) -> str:
    """The lines of ``text`` that describe or sample one of ``names``."""
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in names:
                keep.append(line)
            continue
        end = len(line)
        for stop in ("{", " ", "\t"):
            at = line.find(stop)
            if 0 <= at < end:
                end = at
        if line[:end] in names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def _sums(text: str, names: frozenset[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per series name: the sum of its finite samples, and the largest of them."""
    total: dict[str, float] = {}
    top: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in names or not math.isfinite(s.value):
                    continue
                total[s.name] = total.get(s.name, 0.0) + s.value
                top[s.name] = max(top.get(s.name, -math.inf), s.value)
    except Exception as exc:  # the parser raises assorted types on garbage
        raise MetricsParseError(f"not Prometheus text: {exc}") from None
    return total, top


def _first(found: dict[str, float], names: Iterable[str]) -> float | None:
    return next((found[n] for n in names if n in found), None)


def _count(value: float | None) -> int:
    return 0 if value is None else int(min(MAX_REQUESTS, max(0.0, value)))


DEFAULT_NAMES = MetricNames()


def parse_report(body: bytes, names: MetricNames = DEFAULT_NAMES) -> EngineReport:
    """An engine's load from its /metrics body; raises ``MetricsParseError``.

    Neither a running nor a waiting series present is an error too: the engine exports
    none of the names configured, so it reports nothing the router can use.
    """
    wanted = frozenset((*names.running, *names.waiting, *names.kv_usage))
    text = body[:MAX_BYTES].decode("utf-8", "replace")
    total, top = _sums(_wanted_lines(text, wanted), wanted)
    running = _first(total, names.running)
    waiting = _first(total, names.waiting)
    if running is None and waiting is None:
        raise MetricsParseError("no running or waiting series among the configured names")
    usage = _first(top, names.kv_usage)
    return EngineReport(
        running=_count(running),
        waiting=_count(waiting),
        kv_usage=min(1.0, max(0.0, usage or 0.0)),
    )


def _label_int(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


def parse_capacity(body: bytes) -> int | None:
    """The tokens an engine's prefix cache holds, from its /metrics; None when it says not.

    Several samples (data-parallel ranks, each with a cache of its own) add up. Never raises.
    """
    text = _wanted_lines(body[:MAX_BYTES].decode("utf-8", "replace"), _CAPACITY_NAMES)
    tokens = 0
    per: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == _VLLM_INFO:
                    size = _label_int(s.labels, "kv_cache_size_tokens")
                    blocks = _label_int(s.labels, "num_gpu_blocks")
                    block = _label_int(s.labels, "block_size")
                    if size is None and blocks is not None and block is not None:
                        size = blocks * block
                    tokens += size or 0
                elif math.isfinite(s.value) and s.value > 0:
                    per[s.name] = per.get(s.name, 0.0) + s.value
    except Exception:  # the parser raises assorted types on garbage: no capacity, then
        return None
    if not tokens:
        tokens = int(per.get(_SGLANG_TOKENS, 0))
    if not tokens and _DYNAMO_BLOCKS in per and _DYNAMO_BLOCK_SIZE in per:
        tokens = int(per[_DYNAMO_BLOCKS] * per[_DYNAMO_BLOCK_SIZE])
    return tokens if 0 < tokens <= MAX_CAPACITY_TOKENS else None


class EngineMetricsScraper:
    """The loop that scrapes every healthy engine's /metrics into the routing core."""

    def __init__(
        self,
        cfg: EngineMetricsSettings,
        upstream: Upstream,
        engines: Callable[[], Iterable[str]],
        sink: Sink,
        *,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] = lambda _result: None,
        capacity: Callable[[str, int], None] = lambda _url, _tokens: None,
    ) -> None:
        self.cfg = cfg
        self._upstream = upstream
        self._engines = engines
        self._sink = sink
        self._clock = clock
        self._count = count  # one call per scrape: ok, error, status or parse_error
        self._failing: set[str] = set()  # engines whose last scrape failed (logged once)
        self._capacity = capacity  # an engine's cache size, in tokens, when it reports one
        self._sized: dict[str, float] = {}  # engine -> when its cache size was last read

    async def scrape(self, url: str) -> EngineReport | None:
        """Scrape one engine; hand its report to the sink, or count why there is none."""
        at = self._clock()
        try:
            status, body = await self._upstream.fetch(url, PATH, self.cfg.timeout_seconds)
        except UpstreamError as e:
            self._failed(url, "error", e.message)
            return None
        if status != 200:
            self._failed(url, "status", f"GET {PATH} answered {status}")
            return None
        try:
            report = parse_report(body, self.cfg.names)
        except MetricsParseError as e:
            self._failed(url, "parse_error", str(e))
            return None
        self._count("ok")
        self._failing.discard(url)
        self._sink(url, report, at)
        if self.cfg.learn_capacity:
            self._size(url, body, at)
        return report

    def _size(self, url: str, body: bytes, at: float) -> None:
        """Read ``url``'s cache size from its scrape, at most every refresh period."""
        if at - self._sized.get(url, -math.inf) < CAPACITY_REFRESH_SECONDS:
            return
        self._sized[url] = at
        tokens = parse_capacity(body)
        if tokens is not None:
            self._capacity(url, tokens)

    def _failed(self, url: str, result: str, why: str) -> None:
        self._count(result)
        if url not in self._failing:
            self._failing.add(url)
            log.warning("engine %s: no load report (%s); using the router's own figures", url, why)
        return None

    async def scrape_all(self) -> None:
        urls = list(self._engines())
        for gone in set(self._sized) - set(urls):
            del self._sized[gone]  # read again should it come back (a restart may resize it)
        await asyncio.gather(*(self.scrape(url) for url in urls))

    async def run(self) -> None:
        """Scrape every interval, forever (returns at once when disabled)."""
        if not self.cfg.enabled:
            return
        while True:
            await self.scrape_all()
            await asyncio.sleep(self.cfg.interval_seconds)
