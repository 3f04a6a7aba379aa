"""ttft-estimate: the time to first token, in prefill tokens, from everything that delays it."""

from __future__ import annotations

from dataclasses import dataclass

from router.core import hotpath
from router.core.fields import Fields
from router.core.scorers.base import Inputs, ScorerType, falling, param, read_params

NAME = "ttft-estimate"


@dataclass(frozen=True, slots=True)
class Params:
    """Prefill-token equivalents, in the engines' tokens (``in_router_tokens``), charged per
    request queued inside the engine (``wait_tokens``) and per request in its batch
    (``running_tokens``), and the KV cache use above which cached overlap is discounted
    (``kv_pressure``: a full cache evicts the prefix the router is counting on)."""

    wait_tokens: int = param(2048, 0, 10_000_000)
    running_tokens: int = param(128, 0, 10_000_000)
    kv_pressure: float = param(0.9, 0.0, 1.0)


def parse(f: Fields) -> Params:
    """The params of a ``ttft-estimate`` entry."""
    return read_params(Params, f)


def in_router_tokens(p: Params, x: Inputs) -> tuple[int, int]:
    """``wait_tokens`` and ``running_tokens``, engine prefill tokens, in the router's tokens.

    The prompt and the queues are counted as the router counts (four characters a token when
    approximate); with engines whose tokenizer cuts far fewer characters to a token, the same
    params read unscaled would weigh a cache hit at a fraction of its prefill against a queue.
    """
    s = x.token_scale
    if s == 1.0:
        return p.wait_tokens, p.running_tokens
    return round(p.wait_tokens * s), round(p.running_tokens * s)


def costs(p: Params, x: Inputs) -> list[float]:
    """Per candidate, the prefill tokens that stand between this request and its first token.

    The uncached prompt tokens queued on it (sent by the routers, not yet prefilled: a
    request's prompt stops counting at its first byte), this prompt's uncached part,
    ``wait_tokens`` per batch slot it would wait for inside the engine and ``running_tokens``
    per request in its batch (both engine-reported where fresh), with the cached overlap
    discounted linearly from full at ``kv_pressure`` KV use to none at a full cache.
    """
    pt, bt, knee = x.prompt_tokens, x.block_tokens, p.kv_pressure
    wt, rt = in_router_tokens(p, x)
    overlaps = x.scored_overlaps
    native = hotpath.native
    if native is not None:
        try:
            return native.ttft_costs(
                overlaps, x.tokens, x.requests, x.waiting, x.kv_usage, pt, bt, wt, rt, knee
            )
        except (OverflowError, TypeError):  # past 64-bit figures: the reference copes
            pass
    n = len(x.candidates)
    waiting = x.waiting or [0] * n
    usage = x.kv_usage or [0.0] * n
    out = []
    # Runs for every scored candidate of every request: conditionals, not max() calls.
    for o, queued, r, w, u in zip(overlaps, x.tokens, x.requests, waiting, usage, strict=True):
        cached = o * bt
        if cached and u > knee:
            cached = int(cached * (1.0 - u if u < 1.0 else 0.0) / (1.0 - knee))
        uncached = pt - cached if pt > cached else 0
        running = r - w if r > w else 0
        out.append(float(queued + uncached + wt * w + rt * running))
    return out


def score(p: Params, x: Inputs) -> list[float]:
    """Estimated time to first token (``costs``): 1 for the cheapest candidate, falling
    linearly to 0 at the dearest. A hot prefix stays on its engines while the prefill it saves
    exceeds their queues, and spreads (one extra prefill) once they are saturated.
    """
    return falling(costs(p, x))


TYPE = ScorerType(NAME, Params, parse, score)
