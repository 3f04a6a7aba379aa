"""A routing decision as a value: where a request goes, where next if that fails, and why.

``RoutingCore.decide`` (``core.decision``) makes it and changes nothing; the gateway and the
simulator try ``plan()`` in order, and ``explain()`` is what ``POST /debug/route`` answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.core.scorers.base import Inputs


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes, where next if that fails, and why; ``engine`` None: nowhere."""

    engine: str | None
    reason: str
    keys: tuple[int, ...]
    prompt_tokens: int
    inputs: Inputs
    # Per candidate, in ``inputs.candidates`` order: of its overlap, the provisional blocks.
    predicted: tuple[int, ...]
    eligible: tuple[bool, ...]
    scores: Mapping[str, tuple[float, ...]]
    totals: tuple[float, ...]
    # The other candidates, best first: eligible before ineligible, then by score.
    fallbacks: tuple[str, ...]
    session: str | None = None
    # Per candidate: where its overlap came from (event, predicted, approximate, none).
    sources: tuple[str, ...] = ()
    # The key of the deepest prefix some candidate holds: requests in flight per key are
    # its heat (``HotPrefix``). None: nobody holds any of the prompt.
    prefix: int | None = None

    def plan(self) -> tuple[str, ...]:
        """The engines to try, in order: the pick, then the fallbacks."""
        return () if self.engine is None else (self.engine, *self.fallbacks)

    def overlap_of(self, engine: str) -> int:
        """Leading blocks ``engine`` held (or was predicted to) when the decision was made."""
        x = self.inputs
        return x.overlaps[x.candidates.index(engine)] if engine in x.candidates else 0

    def source_of(self, i: int) -> str:
        """Where candidate ``i``'s overlap came from."""
        if self.sources:
            return self.sources[i]
        return "approximate" if self.inputs.overlaps[i] else "none"

    @property
    def overlap_ratio(self) -> float:
        """The share of the request's blocks the chosen engine held."""
        if self.engine is None or not self.keys:
            return 0.0
        return self.overlap_of(self.engine) / len(self.keys)

    def explain(self) -> dict[str, Any]:
        """A JSON-ready account of the decision, per candidate."""
        x = self.inputs
        return {
            "engine": self.engine,
            "reason": self.reason,
            "blocks": len(self.keys),
            "prompt_tokens": self.prompt_tokens,
            "spread_blocks": self.inputs.credit,
            "fallbacks": list(self.fallbacks),
            "candidates": [
                {
                    "engine": e,
                    "overlap_blocks": x.overlaps[i],
                    "predicted_blocks": self.predicted[i],
                    "overlap_source": self.source_of(i),
                    "inflight_requests": x.requests[i],
                    "inflight_tokens": x.tokens[i],
                    "wait_slots": x.waiting[i] if x.waiting else 0,
                    "eligible": self.eligible[i],
                    "scores": {name: round(v[i], 6) for name, v in self.scores.items()},
                    "total": round(self.totals[i], 6),
                }
                for i, e in enumerate(x.candidates)
            ],
        }
