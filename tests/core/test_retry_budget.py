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


def test_retry_away_from_one_failing_engine_is_isolated() -> None:
    b = RetryBudget()
    b.failed("a", now=100.0)
    assert b.isolated("b", known=2, now=100.5)
    assert not b.isolated("a", known=2, now=100.5)  # the failing engine itself is no refuge


def test_most_of_the_fleet_failing_is_no_longer_isolated() -> None:
    b = RetryBudget(BudgetRules(isolated_share=0.5))
    for e in ("a", "b"):
        b.failed(e, now=100.0)
    assert b.failing(100.0) == 2
    assert b.isolated("c", known=4, now=100.0)
    b.failed("c", now=100.0)
    assert not b.isolated("d", known=4, now=100.0)  # three of four failing: a brown-out


def test_an_answer_or_time_clears_a_failure() -> None:
    b = RetryBudget(BudgetRules(failing_for_seconds=10.0))
    b.failed("a", now=100.0)
    b.failed("b", now=100.0)
    b.answered("a")
    assert b.failing(100.0) == 1
    assert b.failing(111.0) == 0
    assert b.isolated("b", known=2, now=111.0)


def test_forget_drops_engines_gone_from_the_fleet() -> None:
    b = RetryBudget()
    for e in ("a", "b", "c"):
        b.failed(e, now=1.0)
    b.forget({"a"})
    assert b.failing(1.0) == 1
