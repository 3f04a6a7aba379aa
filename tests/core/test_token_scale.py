"""The router's tokens per engine token, learnt from answered prompts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.core.token_scale import BOUNDS, MIN_REQUESTS, TokenScale


def test_ratio_follows_recent_traffic_and_says_when_it_moved() -> None:
    s = TokenScale()
    moved = [s.observe(400, 1000) for _ in range(MIN_REQUESTS)]
    assert moved == [False] * (MIN_REQUESTS - 1) + [True] and abs(s.ratio - 0.4) < 1e-9
    assert abs(s.router_tokens(10_000) - 4000) <= 1
    assert not s.observe(400, 1000)  # unchanged
    for _ in range(3000):  # the traffic changes tokenizer: the ratio follows, bounded in time
        s.observe(1000, 1000)
    assert abs(s.ratio - 1.0) <= 0.05


@given(st.lists(st.tuples(st.integers(-5, 10**7), st.integers(-5, 10**7)), max_size=200))
def test_ratio_stays_within_bounds_whatever_the_counts(pairs: list[tuple[int, int]]) -> None:
    s = TokenScale()
    for router, engine in pairs:
        s.observe(router, engine)
    assert BOUNDS[0] <= s.ratio <= BOUNDS[1]
