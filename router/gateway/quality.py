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
``forget_engines`` drops a gone engine's series, as ``Metrics.forget_engines`` does. The
counts are plain integers turned into families at scrape time: a request adds to them for
about a microsecond, where labelled Prometheus counters cost several each.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from router.core.verdict import NOT_DEEPEST

MODES = ("approximate", "precise")
DIRECTIONS = ("over", "under")
TOKENS = ("reachable", "routed", "achieved")
_TOKENS_HELP = {
    "reachable": "Prompt tokens the deepest eligible engine was believed to hold "
    "(answers with usage).",
    "routed": "Prompt tokens the engine that answered was believed to hold (answers with usage).",
    "achieved": "Prompt tokens the engine that answered reported cached in its usage.",
}


class RoutingQuality(Collector):
    """The routing-quality counters, exported from the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._tokens: dict[str, list[int]] = {}  # engine -> reachable, routed, achieved
        self._errors: dict[tuple[str, str], list[int]] = {}  # (engine, mode) -> over, under
        self._reasons = dict.fromkeys(NOT_DEEPEST, 0)
        registry.register(self)

    def decided(self, reason: str | None) -> None:
        """One decision made; ``reason``: why its pick was not the deepest holder."""
        if reason is not None:
            self._reasons[reason] += 1

    def answered(self, engine: str, mode: str, reachable: int, routed: int, achieved: int) -> None:
        """One answer from ``engine`` with its usage: tokens reached, routed and cached."""
        t = self._tokens.get(engine)
        if t is None:
            t = self._tokens[engine] = [0, 0, 0]
        t[0] += reachable
        t[1] += routed
        t[2] += achieved
        e = self._errors.get((engine, mode))
        if e is None:
            e = self._errors[engine, mode] = [0, 0]
        gap = routed - achieved
        if gap > 0:
            e[0] += gap
        else:
            e[1] -= gap

    def forget_engines(self, keep: Iterable[str]) -> None:
        """Drop the series of engines that are gone."""
        keep = set(keep)
        for engine in [e for e in self._tokens if e not in keep]:
            del self._tokens[engine]
        for key in [k for k in self._errors if k[0] not in keep]:
            del self._errors[key]

    def describe(self) -> Iterable[Metric]:
        return self._families({}, {}, {})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._tokens, self._errors, self._reasons)

    @staticmethod
    def _families(
        tokens: dict[str, list[int]],
        errors: dict[tuple[str, str], list[int]],
        reasons: dict[str, int],
    ) -> list[Metric]:
        out: list[Metric] = []
        for i, name in enumerate(TOKENS):
            fam = CounterMetricFamily(
                f"kvrouter_prefix_{name}_tokens", _TOKENS_HELP[name], labels=["engine"]
            )
            for engine, counts in tokens.items():
                fam.add_metric([engine], counts[i])
            out.append(fam)
        err = CounterMetricFamily(
            "kvrouter_prefix_belief_error_tokens",
            "Believed minus reported cached tokens per answer: over (believed more) or under.",
            labels=["engine", "mode", "direction"],
        )
        for (engine, mode), (over, under) in errors.items():
            err.add_metric([engine, mode, "over"], over)
            err.add_metric([engine, mode, "under"], under)
        out.append(err)
        fam = CounterMetricFamily(
            "kvrouter_decisions_not_deepest",
            "Decisions whose pick held less of the prompt than the deepest holder, by reason.",
            labels=["reason"],
        )
        for reason, n in reasons.items():
            fam.add_metric([reason], n)
        out.append(fam)
        return out
