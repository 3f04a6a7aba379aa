"""The gateway's Prometheus metrics, in a registry the app owns.

Names are a contract with the Grafana dashboard. Events (requests, retries, reloads, token
counts) are counters and histograms updated as they happen; state (in-flight load, health,
index size, gossip peers) is read at scrape time by a collector, so it can never drift from
the router's own figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.core.load import EngineReport, Load
from router.gateway.disagg.metrics import DisaggMetrics, inflight_by_role
from router.gateway.quality import RoutingQuality

if TYPE_CHECKING:
    from router.gossip import Sample

# Generation requests run from milliseconds (embeddings, cache hits) to minutes.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A routing decision should take microseconds; the upper buckets catch pathological prompts.
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0)

GOSSIP_PEERS = "kvrouter_gossip_peers"
# Help for the gossip node's series (router.gossip.stats.samples); names ending in _total are
# counters, the rest gauges.
GOSSIP_HELP: Mapping[str, str] = {
    "kvrouter_gossip_rounds_total": "Gossip rounds that sent rumours to at least one peer.",
    "kvrouter_gossip_probes_total": "SWIM failure-detection probes, by result.",
    "kvrouter_gossip_messages_total": "Gossip messages, by direction.",
    "kvrouter_gossip_bytes_total": "Gossip bytes on the wire (MACs and framing included).",
    "kvrouter_gossip_call_failures_total": "Gossip calls to peers that failed or timed out.",
    "kvrouter_gossip_deltas_total": (
        "Index deltas: published (this replica's), applied (a peer's, merged), duplicate."
    ),
    "kvrouter_gossip_load_reports_total": (
        "Peers' load reports: applied, or dropped (from a member known dead)."
    ),
    "kvrouter_gossip_snapshots_total": "Whole-index snapshots sent to and received from peers.",
    "kvrouter_gossip_refused_total": (
        "Gossip messages refused, never merged: bad MAC (wrong secret), replay, stale, "
        "malformed, or meant for another replica (recipient)."
    ),
    "kvrouter_gossip_queue_dropped_total": "Rumours dropped from full transmit queues.",
    "kvrouter_gossip_errors_total": "Internal errors in gossip loops and handlers.",
    "kvrouter_gossip_queued_rumours": "Rumours waiting to be sent.",
    "kvrouter_gossip_retained_deltas": "Recent deltas kept to repair peers that missed them.",
    "kvrouter_gossip_retained_bytes": "Bytes of the retained deltas.",
    "kvrouter_gossip_load_origins": "Replicas whose load reports this replica holds.",
    "kvrouter_gossip_incarnation": "This replica's SWIM incarnation (raised to refute).",
    "kvrouter_gossip_convergence_lag_seconds": (
        "Seconds from creation to arrival of the newest delta from each live origin."
    ),
}


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the scrape-time collector reads: callables over the live gateway state."""

    engines: Callable[[], Iterable[tuple[str, bool]]]  # (url, healthy) of known engines
    local_load: Callable[[str], Load]
    index_entries: Callable[[], int]
    # Peers by state; gossip plugs its own in (until then there are none).
    gossip_peers: Callable[[], Mapping[str, int]] = lambda: {"alive": 0}
    # The gossip node's other series (none while gossip is off).
    gossip: Callable[[], Iterable[Sample]] = lambda: ()
    # Engines' fresh reports of their own load (router.gateway.fleet.scrape).
    engine_reports: Callable[[], Iterable[tuple[str, EngineReport]]] = lambda: ()
    # Requests waiting in the flow-control queue, by priority.
    queue_depth: Callable[[], Mapping[int, int]] = lambda: {}
    # Client connections open, and those refused by reason (router.gateway.inbound.connections).
    connections_open: Callable[[], int] = lambda: 0
    connections_rejected: Callable[[], Mapping[str, int]] = lambda: {}
    # Engines whose role is not both (router.core.disaggregation), for the in-flight per role.
    roles: Callable[[], Mapping[str, str]] = lambda: {}


class _FleetCollector(Collector):
    def __init__(self, view: FleetView) -> None:
        self._view = view

    def describe(self) -> Iterable[Metric]:
        # Names without samples, so registering does not read state that is not built yet.
        return self._families(FleetView(lambda: (), lambda _e: Load(), lambda: 0, dict))

    def collect(self) -> Iterable[Metric]:
        return self._families(self._view)

    @staticmethod
    def _families(v: FleetView) -> list[Metric]:
        reqs = GaugeMetricFamily(
            "kvrouter_backend_inflight_requests",
            "Requests this router has in flight on each engine.",
            labels=["backend"],
        )
        toks = GaugeMetricFamily(
            "kvrouter_backend_inflight_tokens",
            "Prompt tokens (not believed cached) this router has sent each engine to prefill, "
            "until its answer begins.",
            labels=["backend"],
        )
        healthy = GaugeMetricFamily(
            "kvrouter_backend_healthy",
            "1 when the backend is a routing candidate, 0 when pending or ejected.",
            labels=["backend"],
        )
        inflight: list[tuple[str, int]] = []
        for url, ok in v.engines():
            load = v.local_load(url)
            inflight.append((url, load.requests))
            reqs.add_metric([url], load.requests)
            toks.add_metric([url], load.tokens)
            healthy.add_metric([url], 1 if ok else 0)
        blocks = GaugeMetricFamily(
            "kvrouter_index_blocks",
            "(block, engine) entries in the router's prefix index.",
            value=v.index_entries(),
        )
        peers = GaugeMetricFamily(
            GOSSIP_PEERS, "Gossip peers by membership state.", labels=["state"]
        )
        for state, n in sorted(v.gossip_peers().items()):
            peers.add_metric([state], n)
        reported = GaugeMetricFamily(
            "kvrouter_backend_reported_requests",
            "Requests each engine reports in its batch (running) and queued (waiting).",
            labels=["backend", "state"],
        )
        kv = GaugeMetricFamily(
            "kvrouter_backend_kv_usage",
            "Share of its KV cache each engine reports in use, from 0 to 1.",
            labels=["backend"],
        )
        for url, rep in v.engine_reports():
            reported.add_metric([url, "running"], rep.running)
            reported.add_metric([url, "waiting"], rep.waiting)
            kv.add_metric([url], rep.kv_usage)
        depth = GaugeMetricFamily(
            "kvrouter_queue_depth",
            "Requests waiting in the flow-control queue, by priority.",
            labels=["priority"],
        )
        for prio, n in sorted(v.queue_depth().items()):
            depth.add_metric([str(prio)], n)
        conns = GaugeMetricFamily(
            "kvrouter_client_connections",
            "Client connections open in this process (refused ones never count).",
            value=v.connections_open(),
        )
        refused = CounterMetricFamily(
            "kvrouter_client_connections_rejected",
            "Client connections closed unserved: beyond limits.max_connections (503), or "
            "without a request's headers within limits.header_timeout_seconds (408).",
            labels=["reason"],
        )
        for reason, n in sorted(v.connections_rejected().items()):
            refused.add_metric([reason], n)
        return [
            reqs,
            toks,
            healthy,
            blocks,
            peers,
            reported,
            kv,
            depth,
            conns,
            refused,
            inflight_by_role(inflight, v.roles()),
            *_gossip_families(v.gossip()),
        ]


def _gossip_families(series: Iterable[Sample]) -> list[Metric]:
    """Group the gossip node's samples into families (the peers gauge is exported apart)."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for s in series:
        if s.name == GOSSIP_PEERS:
            continue
        fam = families.get(s.name)
        if fam is None:
            doc = GOSSIP_HELP.get(s.name, "Gossip: " + s.name.removeprefix("kvrouter_gossip_"))
            kind = CounterMetricFamily if s.name.endswith("_total") else GaugeMetricFamily
            fam = families[s.name] = kind(s.name, doc, labels=sorted(s.labels))
        fam.add_metric([s.labels[k] for k in sorted(s.labels)], s.value)
    return list(families.values())


class Metrics:
    """Every metric the gateway exports, registered in its own ``registry``."""

    def __init__(self, view: FleetView) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "kvrouter_requests",
            "Requests answered, by route and HTTP status (499: the client went away).",
            ["route", "code"],
            registry=r,
        )
        self.duration = Histogram(
            "kvrouter_request_duration_seconds",
            "Time from a request's arrival to the end of its response, at the router.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvrouter_ttft_seconds",
            "Time from a streamed request's arrival to its first body byte sent, at the router.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.decision = Histogram(
            "kvrouter_routing_decision_seconds",
            "Time to choose an engine (block keys, index lookup, scoring).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.overlap = Histogram(
            "kvrouter_prefix_overlap_ratio",
            "Share of a request's blocks the chosen engine was believed to hold.",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.engine_requests = Counter(
            "kvrouter_backend_requests",
            "Attempts sent to each engine, by its status (or error, timeout).",
            ["backend", "code"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "kvrouter_cached_tokens",
            "Prompt tokens the engines reported as served from their prefix cache.",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "kvrouter_prompt_tokens",
            "Prompt tokens the engines reported (with cached tokens: the real hit ratio).",
            registry=r,
        )
        self.reloads = Counter(
            "kvrouter_policy_reloads",
            "Policy file reloads, by result (error: rejected, the old policy stayed).",
            ["result"],
            registry=r,
        )
        for result in ("success", "error"):
            self.reloads.labels(result)
        self.retries = Counter(
            "kvrouter_retries",
            "Attempts retried on another engine after a failure before the first byte.",
            registry=r,
        )
        self.admitted = Counter(
            "kvrouter_admitted",
            "Requests let through by flow control: at once, or after waiting in the queue.",
            ["path"],
            registry=r,
        )
        self.rejected = Counter(
            "kvrouter_rejected",
            "Requests flow control turned away with a 429, by reason (queue_full, timeout).",
            ["reason"],
            registry=r,
        )
        for path in ("immediate", "queued"):
            self.admitted.labels(path)
        for reason in ("queue_full", "timeout"):
            self.rejected.labels(reason)
        self.queue_wait = Histogram(
            "kvrouter_queue_wait_seconds",
            "Time requests spent in the flow-control queue (those that waited).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.retries_refused = Counter(
            "kvrouter_retries_refused",
            "Retries not made because the retry budget was spent.",
            registry=r,
        )
        self.engine_scrapes = Counter(
            "kvrouter_engine_scrapes",
            "Scrapes of the engines' /metrics, by result (ok, error, status, parse_error).",
            ["result"],
            registry=r,
        )
        for result in ("ok", "error", "status", "parse_error"):
            self.engine_scrapes.labels(result)
        self.config_reloads = Counter(
            "kvrouter_config_reloads",
            "Reloads of the config file's hot sections (models), by result (error: rejected).",
            ["result"],
            registry=r,
        )
        for result in ("success", "error"):
            self.config_reloads.labels(result)
        self.engine_aborts = Counter(
            "kvrouter_engine_aborts",
            "Aborts sent to engines for requests whose client left (sent, failed, dropped).",
            ["result"],
            registry=r,
        )
        for result in ("sent", "failed", "dropped"):
            self.engine_aborts.labels(result)
        r.register(_FleetCollector(view))
        self._codes: dict[str, set[str]] = {}
        self.quality = RoutingQuality(r)  # the kvrouter_prefix_* and not-deepest counters
        self.disagg = DisaggMetrics(r)  # decisions by path, estimated transfers

    def engine_request(self, engine: str, code: str) -> None:
        self._codes.setdefault(engine, set()).add(code)
        self.engine_requests.labels(engine, code).inc()

    def forget_engines(self, keep: Iterable[str]) -> None:
        """Drop the per-engine series of engines that are gone (DNS churn stays bounded)."""
        keep = set(keep)
        for backend in [b for b in self._codes if b not in keep]:
            for code in self._codes.pop(backend):
                self.engine_requests.remove(backend, code)
        self.quality.forget_engines(keep)

    def usage(self, prompt: int, cached: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
