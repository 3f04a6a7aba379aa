"""A retry budget: retries in flight are a bounded share of requests in flight (Envoy's),
except where one engine is failing while the rest of the fleet answers.

A bad minute (an engine failing, or clients sending requests that fail everywhere) must not
multiply the fleet's load: at any moment, the retries under way may be at most ``ratio`` of
the requests under way, or ``min_retries`` when that is more (so a quiet gateway can still
retry).

That rule cannot tell a fleet-wide brown-out from one sick engine, and in the second case it
fails clients for nothing: kill the engine holding half of ten requests and five retries
want a budget of three, while the other engine idles. So the budget also remembers, per
engine, whether its last attempt failed recently. A retry is *isolated*, and free, when its
target is not failing and at most ``isolated_share`` of the known engines are: the retries
then only move one engine's share of the traffic to engines that answer, which is no storm.
When most of the fleet fails, every retry spends from the budget again. Memory: two counters
and one entry per engine (``forget`` drops gone ones).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetRules:
    ratio: float = 0.2
    min_retries: int = 3
    # A failure older than this says nothing of an engine's health now.
    failing_for_seconds: float = 10.0
    # At most this share of the known engines failing still counts as one engine's trouble.
    isolated_share: float = 0.5


class RetryBudget:
    """Requests and retries in flight; ``try_retry`` spends from the budget."""

    def __init__(self, rules: BudgetRules = BudgetRules()) -> None:
        self.rules = rules
        self.requests = 0
        self.retries = 0
        # Engine -> when its last attempt failed; absent once an attempt there succeeds.
        self._failed_at: dict[str, float] = {}

    def enter(self) -> None:
        """A request starts (pair with ``leave``)."""
        self.requests += 1

    def leave(self, retries: int) -> None:
        """A request ends, giving back the ``retries`` its ``try_retry`` calls granted."""
        self.requests = max(0, self.requests - 1)
        self.retries = max(0, self.retries - retries)

    def failed(self, engine: str, now: float) -> None:
        """An attempt at ``engine`` failed (whoever is to blame)."""
        self._failed_at[engine] = now

    def answered(self, engine: str) -> None:
        """An attempt at ``engine`` got an answer: it is not failing."""
        self._failed_at.pop(engine, None)

    def forget(self, known: set[str] | frozenset[str]) -> None:
        """Keep only the engines in ``known``."""
        for engine in [e for e in self._failed_at if e not in known]:
            del self._failed_at[engine]

    def failing(self, now: float) -> int:
        """How many engines failed their last attempt within ``failing_for_seconds``."""
        since = now - self.rules.failing_for_seconds
        return sum(1 for t in self._failed_at.values() if t >= since)

    def isolated(self, target: str, known: int, now: float) -> bool:
        """Whether a retry on ``target`` moves one sick engine's traffic, not a storm's."""
        since = now - self.rules.failing_for_seconds
        if self._failed_at.get(target, since - 1.0) >= since:
            return False
        return self.failing(now) <= self.rules.isolated_share * known

    def try_retry(self) -> bool:
        """True (and the retry counted until its request leaves) while within budget."""
        limit = max(self.rules.min_retries, self.rules.ratio * self.requests)
        if self.retries + 1 > limit:
            return False
        self.retries += 1
        return True
