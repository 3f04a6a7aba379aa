"""Routing-quality metrics: how much of the prompts' cache the router reached, and why not.

Counted once per request when it ends (router.gateway.receipt), from its decision
(router.core.verdict) and its answer's ``usage``. The three token counters count the same
requests, those answered 200 on a generation route with ``usage`` reporting cached tokens
(streams need ``stream_options.include_usage``), under the label ``engine`` of the engine
that answered; tokens are the router's estimate (``Decision.believed_tokens``) for the first
two and the engine's report for the third:

- ``kvrouter_prefix_reachable_tokens_total``: what the deepest eligible candidate held;
- ``kvrouter_prefix_routed_tokens_total``: what the engine that answered was believed to hold;
- ``kvrouter_prefix_achieved_tokens_total``: what it reported cached.

``kvrouter_prefix_belief_error_tokens_total{engine, mode, direction}`` is the index's error on
those requests: ``over`` sums routed minus achieved where the router believed more (an
eviction it did not see), ``under`` achieved minus routed where the engine had more (traffic
that bypassed this router, a prefix shorter than a block); ``mode`` is ``precise`` for an
engine whose KV events the index holds, else ``approximate``.
``kvrouter_decisions_not_deepest_total{reason}`` counts every decision whose pick held less of
the prompt than the deepest holder, by ``Decision.not_deepest``.

No ``model`` label: model names are the clients' text, unbounded. Engines come and go:
``forget_engines`` drops a gone engine's series, as ``Metrics.forget_engines`` does.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from router.core.verdict import NOT_DEEPEST

MODES = ("approximate", "precise")
DIRECTIONS = ("over", "under")


class RoutingQuality:
    """The routing-quality counters, in the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.reachable = Counter(
            "kvrouter_prefix_reachable_tokens",
            "Prompt tokens the deepest eligible engine was believed to hold (answers with usage).",
            ["engine"],
            registry=r,
        )
        self.routed = Counter(
            "kvrouter_prefix_routed_tokens",
            "Prompt tokens the engine that answered was believed to hold (answers with usage).",
            ["engine"],
            registry=r,
        )
        self.achieved = Counter(
            "kvrouter_prefix_achieved_tokens",
            "Prompt tokens the engine that answered reported cached in its usage.",
            ["engine"],
            registry=r,
        )
        self.belief_error = Counter(
            "kvrouter_prefix_belief_error_tokens",
            "Believed minus reported cached tokens per answer: over (believed more) or under.",
            ["engine", "mode", "direction"],
            registry=r,
        )
        self.not_deepest = Counter(
            "kvrouter_decisions_not_deepest",
            "Decisions whose pick held less of the prompt than the deepest holder, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in NOT_DEEPEST:
            self.not_deepest.labels(reason)
        self._modes: dict[str, set[str]] = {}  # engine -> modes its belief error is counted in

    def decided(self, reason: str | None) -> None:
        """One decision made; ``reason``: why its pick was not the deepest holder."""
        if reason is not None:
            self.not_deepest.labels(reason).inc()

    def answered(self, engine: str, mode: str, reachable: int, routed: int, achieved: int) -> None:
        """One answer from ``engine`` with its usage: tokens reached, routed and cached."""
        self._modes.setdefault(engine, set()).add(mode)
        self.reachable.labels(engine).inc(reachable)
        self.routed.labels(engine).inc(routed)
        self.achieved.labels(engine).inc(achieved)
        gap = routed - achieved
        self.belief_error.labels(engine, mode, "over").inc(max(0, gap))
        self.belief_error.labels(engine, mode, "under").inc(max(0, -gap))

    def forget_engines(self, keep: Iterable[str]) -> None:
        """Drop the series of engines that are gone."""
        keep = set(keep)
        for engine in [e for e in self._modes if e not in keep]:
            for counter in (self.reachable, self.routed, self.achieved):
                counter.remove(engine)
            for mode in self._modes.pop(engine):
                for direction in DIRECTIONS:
                    self.belief_error.remove(engine, mode, direction)
