"""A retry budget: retries in flight are a bounded share of requests in flight (Envoy's).

A bad minute (an engine failing, or clients sending requests that fail everywhere) must not
multiply the fleet's load: at any moment, the retries under way may be at most ``ratio`` of
the requests under way, or ``min_retries`` when that is more (so a quiet gateway can still
retry). Two counters, nothing that grows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetRules:
    ratio: float = 0.2
    min_retries: int = 3


class RetryBudget:
    """Requests and retries in flight; ``try_retry`` spends from the budget."""

    def __init__(self, rules: BudgetRules = BudgetRules()) -> None:
        self.rules = rules
        self.requests = 0
        self.retries = 0

    def enter(self) -> None:
        """A request starts (pair with ``leave``)."""
        self.requests += 1

    def leave(self, retries: int) -> None:
        """A request ends, giving back the ``retries`` its ``try_retry`` calls granted."""
        self.requests = max(0, self.requests - 1)
        self.retries = max(0, self.retries - retries)

    def try_retry(self) -> bool:
        """True (and the retry counted until its request leaves) while within budget."""
        limit = max(self.rules.min_retries, self.rules.ratio * self.requests)
        if self.retries + 1 > limit:
            return False
        self.retries += 1
        return True
