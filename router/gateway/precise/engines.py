"""The engines whose KV events the index holds, as precise mode asks about them.

The tokenizer (router.gateway.precise.tokenize) asks which engines serving a model are precise
and whether one of them already holds a prompt's every full block; the local tokenizer's check
asks a model each precise engine serves; ``kvrouter_index_entries{source}`` reads how many
index entries came from events, from predictions and from approximate records.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.core.blocks import token_keys
from router.core.decision import RoutingCore
from router.gateway.fleet.pool import EnginePool
from router.gateway.openai.errors import GatewayError
from router.gateway.precise.kv_events import EventMetrics


class PreciseEngines:
    """Precise mode's questions to the engine pool and the index, and its metrics' sources."""

    def __init__(self, core: RoutingCore, pool: EnginePool, event_metrics: EventMetrics) -> None:
        self.core = core
        self.pool = pool
        self.event_metrics = event_metrics
        self._index_sources()

    def engines(self, model: str) -> Sequence[str]:
        """Healthy engines serving ``model`` whose KV events the index holds."""
        try:
            cands = self.pool.candidates(model)
        except GatewayError:
            return ()
        return [e for e in cands if e in self.core.precise]

    def held_whole(self, model: str, lora: str | None, ids: Sequence[int]) -> bool:
        """Whether a precise engine serving ``model`` holds every full block of ``ids``."""
        core = self.core
        by_size: dict[int, list[int]] = {}  # engines of one block size share their keys
        for e in self.engines(model):
            size = core.precise[e]
            keys = by_size.get(size)
            if keys is None:
                keys = by_size[size] = token_keys(ids, size, lora)
            if keys and core.index.event_overlap(e, keys, lambda _m: 1.0)[0] == len(keys):
                return True
        return False

    def models(self) -> list[tuple[str, str]]:
        """(URL, a model it serves) of each healthy engine whose KV events the index holds."""
        engines = (self.pool.engines.get(url) for url in self.core.precise)
        return [(e.url, next(iter(e.models))) for e in engines if e and e.healthy and e.models]

    def tokenized(self, seconds: float | None, ok: bool) -> None:
        """Count one tokenization: its time when it had one, and whether it failed."""
        if seconds is not None:
            self.event_metrics.tokenize.observe(seconds)
        if not ok:
            self.event_metrics.tokenize_failures.inc()

    def _index_sources(self) -> None:
        # Read at scrape time; the index itself is replaced when the block size changes.
        g = self.event_metrics.entries
        g.labels("event").set_function(self._event_entries)
        g.labels("predicted").set_function(lambda: float(len(self.core.predictions)))
        g.labels("approximate").set_function(
            lambda: float(len(self.core.index)) - self._event_entries() - len(self.core.predictions)
        )

    def _event_entries(self) -> float:
        return float(self.core.index.event_blocks())
