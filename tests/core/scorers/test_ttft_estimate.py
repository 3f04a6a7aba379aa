"""ttft-estimate reads its engine-token params in the router's tokens, as the prompt is."""

from __future__ import annotations

from router.core.scorers import ttft_estimate
from router.core.scorers.base import Inputs


def queued_versus_cached(token_scale: float) -> Inputs:
    # e0 holds 8 of the prompt's 10 blocks and has one request waiting for a slot; e1 holds
    # nothing and waits for nothing.
    return Inputs(
        candidates=["e0", "e1"],
        blocks=10,
        overlaps=[8, 0],
        requests=[1, 0],
        tokens=[0, 0],
        session_engine=None,
        prompt_tokens=1000,
        block_tokens=100,
        waiting=[1, 0],
        token_scale=token_scale,
    )


def test_ttft_estimate_params_follow_the_router_tokens_per_engine_token() -> None:
    p = ttft_estimate.Params(wait_tokens=2000, running_tokens=100)
    # Tokens counted alike: the queue (2000) outweighs the 800 cached tokens.
    assert ttft_estimate.costs(p, queued_versus_cached(1.0)) == [200.0 + 2000.0, 1000.0]
    # An engine token is a quarter of the router's: the same queue is 500 of the router's
    # tokens, and the cache hit wins.
    assert ttft_estimate.costs(p, queued_versus_cached(0.25)) == [200.0 + 500.0, 1000.0]
    assert ttft_estimate.in_router_tokens(p, queued_versus_cached(0.25)) == (500, 25)
