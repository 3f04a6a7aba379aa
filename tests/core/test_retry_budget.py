"""The retry budget: a share of the requests in flight, with a floor."""

from __future__ import annotations

import pytest

from router.core.retry_budget import BudgetRules, RetryBudget


@pytest.mark.parametrize(
    ("in_flight", "granted"),
    [(1, 3), (10, 3), (50, 10), (1000, 200)],
    ids=["quiet-floor", "floor-above-share", "share", "busy-share"],
)
def test_retry_budget_share_of_requests_in_flight(in_flight: int, granted: int) -> None:
    b = RetryBudget(BudgetRules(ratio=0.2, min_retries=3))
    for _ in range(in_flight):
        b.enter()
    assert sum(b.try_retry() for _ in range(in_flight * 2 + 10)) == granted


def test_retry_budget_leave_gives_retries_back() -> None:
    b = RetryBudget(BudgetRules(ratio=0.0, min_retries=1))
    b.enter()
    assert b.try_retry() and not b.try_retry()
    b.leave(retries=1)
    b.enter()
    assert b.try_retry()


def test_retry_budget_counters_never_go_negative() -> None:
    b = RetryBudget()
    b.leave(retries=5)
    assert (b.requests, b.retries) == (0, 0)
