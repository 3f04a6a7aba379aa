"""The disaggregated path's metrics, in the gateway's registry (router.gateway.metrics).

- ``kvrouter_disagg_decisions_total{path, why}``: requests decided where disaggregation
  applies, by the path taken (``whole``, ``split``) and why (router.core.disaggregation's
  ``WHYS``);
- ``kvrouter_disagg_transfer_bytes_total``: the KV cache bytes split requests were estimated
  to move from prefill to decode engines;
- ``kvrouter_disagg_transfer_seconds``: the estimated transfer of each split request;
- ``kvrouter_role_inflight_requests{role}``: requests in flight on the engines of each role
  (read at scrape time, like ``kvrouter_backend_inflight_requests``, whose sum it is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from router.core.disaggregation import PATHS, ROLES, WHYS, Disaggregated

# From a few milliseconds (NVLink, a short prompt) to seconds (a slow link, a long document).
TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class DisaggMetrics:
    """Counts each disaggregated decision as it is taken."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "kvrouter_disagg_decisions",
            "Requests decided where disaggregation applies, by path taken and why.",
            ["path", "why"],
            registry=registry,
        )
        for path in PATHS:
            for why in WHYS:
                self.decisions.labels(path, why)
        self.transfer_bytes = Counter(
            "kvrouter_disagg_transfer_bytes",
            "KV cache bytes split requests were estimated to move from prefill to decode.",
            registry=registry,
        )
        self.transfer_seconds = Histogram(
            "kvrouter_disagg_transfer_seconds",
            "Estimated time to move each split request's KV cache over the link.",
            buckets=TRANSFER_BUCKETS,
            registry=registry,
        )

    def decided(self, d: Disaggregated) -> None:
        self.decisions.labels(d.path, d.why).inc()
        if d.path == "split":
            self.transfer_bytes.inc(d.transfer_bytes)
            self.transfer_seconds.observe(d.transfer_seconds)


def inflight_by_role(
    inflight: Iterable[tuple[str, int]], roles: Mapping[str, str]
) -> GaugeMetricFamily:
    """``kvrouter_role_inflight_requests`` from each engine's requests in flight and the roles
    of those that are not ``both``."""
    by_role: dict[str, int] = dict.fromkeys(ROLES, 0)
    for engine, n in inflight:
        role = roles.get(engine, "both")
        by_role[role] = by_role.get(role, 0) + n
    fam = GaugeMetricFamily(
        "kvrouter_role_inflight_requests",
        "Requests this router has in flight on the engines of each role.",
        labels=["role"],
    )
    for role, n in by_role.items():
        fam.add_metric([role], n)
    return fam
