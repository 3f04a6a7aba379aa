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
    tokens: Sequence[int]  # fleet-wide prompt tokens sent and not yet prefilled
    session_engine: str | None  # where this request's session went last, if known
    prompt_tokens: int = 0
    block_tokens: int = 1
    # Engine-reported, blended into ``requests`` already; empty or 0 where nothing is known.
    # Batch slots a request sent now would wait for inside the engine (``LoadBook.backlog``):
    # its queue, and what the routers sent since its report into a batch known to be full.
    waiting: Sequence[int] = ()
    kv_usage: Sequence[float] = ()  # share of its KV cache in use, from 0 to 1
    # Leading blocks of a hot prefix every candidate is scored as holding (``HotPrefix``).
    credit: int = 0

    def uncached(self, i: int) -> int:
        """Prompt tokens candidate ``i`` would have to prefill (the part it does not hold)."""
        return max(0, self.prompt_tokens - self.overlaps[i] * self.block_tokens)

    @property
    def scored_overlaps(self) -> Sequence[int]:
        """The overlaps scorers weigh: what each candidate holds, or the hot prefix's credit."""
        c = self.credit
        return [max(o, c) for o in self.overlaps] if c else self.overlaps


ScoreFn = Callable[[Scorer, Inputs], list[float]]


def prefix_overlap(_s: Scorer, x: Inputs) -> list[float]:
    """The share of the request's blocks the engine already holds; while some candidate could
    start the request at once, divided by one more than the batch slots it would wait for.

    Keeping a prefix on one engine saves cache space, but not at the price of a queue: when
    the engines holding a hot prefix have full batches and another could start the request at
    once, the prefix may spread (ttft-estimate weighs the extra prefill against the wait).
    When every engine would make it wait, the fleet is saturated and holding on to the
    prefix counts in full again (spreading it then costs hits and saves no wait).
    """
    if not x.blocks:
        return [0.0] * len(x.candidates)
    n = x.blocks
    overlaps = x.scored_overlaps
    if not x.waiting or min(x.waiting):
        return [o / n for o in overlaps]
    return [o / n / (1 + w) for o, w in zip(overlaps, x.waiting, strict=True)]


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
    engine's uncached prompt tokens not yet prefilled, so a cache hit on a busy engine wins
    only while the tokens it saves exceed the tokens waiting ahead of it.
    """
    pt, bt = x.prompt_tokens, x.block_tokens
    overlaps = x.scored_overlaps
    costs = [
        q + (pt - o * bt if o * bt < pt else 0) for q, o in zip(x.tokens, overlaps, strict=True)
    ]
    top = max(costs, default=0)
    if top <= 0:
        return [1.0] * len(costs)
    return [1.0 - c / top for c in costs]


def ttft_estimate(s: Scorer, x: Inputs) -> list[float]:
    """Estimated time to first token, in prefill tokens, from everything that delays it.

    Per candidate: the uncached prompt tokens queued on it (sent by the routers, not yet
    prefilled: a request's prompt stops counting at its first byte), this
    prompt's uncached part, ``wait_tokens`` per batch slot it would wait for inside the engine
    and ``running_tokens`` per request in its batch (both engine-reported where fresh), with the
    cached overlap discounted linearly from full at ``kv_pressure`` KV use to none at a full
    cache. 1 for the cheapest candidate, falling linearly to 0 at the dearest. A hot prefix
    stays on its engines while the prefill it saves exceeds their queues, and spreads (one
    extra prefill) once they are saturated.
    """
    n = len(x.candidates)
    pt, bt = x.prompt_tokens, x.block_tokens
    waiting = x.waiting or [0] * n
    usage = x.kv_usage or [0.0] * n
    wt, rt, knee = s.wait_tokens, s.running_tokens, s.kv_pressure
    costs = []
    # Runs for every scored candidate of every request: conditionals, not max() calls.
    for o, queued, r, w, u in zip(
        x.scored_overlaps, x.tokens, x.requests, waiting, usage, strict=True
    ):
        cached = o * bt
        if cached and u > knee:
            cached = int(cached * (1.0 - u if u < 1.0 else 0.0) / (1.0 - knee))
        uncached = pt - cached if pt > cached else 0
        running = r - w if r > w else 0
        costs.append(queued + uncached + wt * w + rt * running)
    top = max(costs, default=0)
    if top <= 0:
        return [1.0] * n
    return [1.0 - c / top for c in costs]


SCORERS: dict[str, ScoreFn] = {
    "prefill-cost": prefill_cost,
    "ttft-estimate": ttft_estimate,
    "prefix-overlap": prefix_overlap,
    "load": load,
    "session-affinity": session_affinity,
}
