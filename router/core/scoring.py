"""Scorers, registered by the kebab-case type name a policy uses.

Each scorer maps the candidates to scores in [0, 1], one per candidate in order, by
construction (the tests check the range on arbitrary inputs); a policy adds them up by
weight. Scorers are pure functions of the ``Inputs`` of one decision; where a session went
last is remembered by the router (bounded) and handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.core.policy import Scorer


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a decision sees: candidates and, per candidate in the same order, its figures."""

    candidates: Sequence[str]
    blocks: int  # full blocks in the request
    overlaps: Sequence[int]  # leading blocks each candidate holds
    requests: Sequence[int]  # fleet-wide in-flight requests
    tokens: Sequence[int]  # fleet-wide in-flight prompt tokens
    session_engine: str | None  # where this request's session went last, if known
    prompt_tokens: int = 0
    block_tokens: int = 1

    def uncached(self, i: int) -> int:
        """Prompt tokens candidate ``i`` would have to prefill (the part it does not hold)."""
        return max(0, self.prompt_tokens - self.overlaps[i] * self.block_tokens)


ScoreFn = Callable[[Scorer, Inputs], list[float]]


def prefix_overlap(_s: Scorer, x: Inputs) -> list[float]:
    """The share of the request's blocks the engine already holds."""
    if not x.blocks:
        return [0.0] * len(x.candidates)
    n = x.blocks
    return [o / n for o in x.overlaps]


def load(s: Scorer, x: Inputs) -> list[float]:
    """1 for the idlest candidate, falling linearly to 0 for the busiest."""
    loads = x.requests if s.metric == "requests" else x.tokens
    top = max(loads, default=0)
    if top <= 0:
        return [1.0] * len(loads)
    return [1.0 - v / top for v in loads]


def session_affinity(_s: Scorer, x: Inputs) -> list[float]:
    """1 for the engine that served this session's previous request."""
    e = x.session_engine
    return [1.0 if c == e else 0.0 for c in x.candidates]


def prefill_cost(_s: Scorer, x: Inputs) -> list[float]:
    """Estimated time to first token: prefill queued on the engine plus this prompt's uncached part.

    1 for the cheapest candidate, falling linearly to 0 at the dearest. The queue is the
    engine's in-flight uncached prompt tokens, so a cache hit on a busy engine wins only while
    the tokens it saves exceed the tokens waiting ahead of it.
    """
    pt, bt = x.prompt_tokens, x.block_tokens
    costs = [
        q + (pt - o * bt if o * bt < pt else 0) for q, o in zip(x.tokens, x.overlaps, strict=True)
    ]
    top = max(costs, default=0)
    if top <= 0:
        return [1.0] * len(costs)
    return [1.0 - c / top for c in costs]


SCORERS: dict[str, ScoreFn] = {
    "prefill-cost": prefill_cost,
    "prefix-overlap": prefix_overlap,
    "load": load,
    "session-affinity": session_affinity,
}
