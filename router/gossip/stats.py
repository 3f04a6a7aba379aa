"""Counters and gauges of one gossip node, as plain numbers for the Prometheus exporter.

``GossipStats`` is a frozen copy taken by ``GossipNode.stats()``; ``samples`` turns it into
``kvrouter_gossip_*`` series (name, labels, value) so the exporter needs no gossip knowledge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

METRIC_PREFIX = "kvrouter_gossip_"


@dataclass(slots=True)
class Counters:
    """Monotonic counts, incremented by the node as things happen."""

    rounds: int = 0
    probes: int = 0
    probe_failures: int = 0
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    call_failures: int = 0
    deltas_published: int = 0
    deltas_applied: int = 0
    deltas_duplicate: int = 0
    loads_applied: int = 0
    loads_dropped: int = 0
    snapshots_sent: int = 0
    snapshots_received: int = 0
    refused_mac: int = 0
    refused_replay: int = 0
    refused_stale: int = 0
    refused_malformed: int = 0
    # Sealed for another node (a frame captured on its way elsewhere), or for no node.
    refused_recipient: int = 0
    queue_dropped: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class GossipStats:
    """A snapshot of one node's counters (monotonic) and gauges (current values)."""

    node_id: str
    counters: Counters
    # Peers per state ("alive", "suspect", "dead"), this node excluded.
    peers: Mapping[str, int]
    # Seconds from creation to arrival of the newest delta applied from each origin.
    convergence_lag: Mapping[str, float]
    queued_rumours: int
    retained_deltas: int
    retained_bytes: int
    load_origins: int = 0
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One Prometheus series: counters end in ``_total``."""

    name: str
    labels: Mapping[str, str]
    value: float


def samples(stats: GossipStats) -> list[Sample]:
    """Every series of ``stats`` under the ``kvrouter_gossip_`` prefix."""
    c = stats.counters
    p = METRIC_PREFIX
    out = [Sample(f"{p}peers", {"state": s}, n) for s, n in stats.peers.items()]
    out += [
        Sample(f"{p}rounds_total", {}, c.rounds),
        Sample(f"{p}probes_total", {"result": "ok"}, c.probes - c.probe_failures),
        Sample(f"{p}probes_total", {"result": "failed"}, c.probe_failures),
        Sample(f"{p}messages_total", {"direction": "in"}, c.messages_in),
        Sample(f"{p}messages_total", {"direction": "out"}, c.messages_out),
        Sample(f"{p}bytes_total", {"direction": "in"}, c.bytes_in),
        Sample(f"{p}bytes_total", {"direction": "out"}, c.bytes_out),
        Sample(f"{p}call_failures_total", {}, c.call_failures),
        Sample(f"{p}deltas_total", {"result": "published"}, c.deltas_published),
        Sample(f"{p}deltas_total", {"result": "applied"}, c.deltas_applied),
        Sample(f"{p}deltas_total", {"result": "duplicate"}, c.deltas_duplicate),
        Sample(f"{p}load_reports_total", {"result": "applied"}, c.loads_applied),
        Sample(f"{p}load_reports_total", {"result": "dropped"}, c.loads_dropped),
        Sample(f"{p}snapshots_total", {"direction": "sent"}, c.snapshots_sent),
        Sample(f"{p}snapshots_total", {"direction": "received"}, c.snapshots_received),
        Sample(f"{p}refused_total", {"reason": "mac"}, c.refused_mac),
        Sample(f"{p}refused_total", {"reason": "replay"}, c.refused_replay),
        Sample(f"{p}refused_total", {"reason": "stale"}, c.refused_stale),
        Sample(f"{p}refused_total", {"reason": "malformed"}, c.refused_malformed),
        Sample(f"{p}refused_total", {"reason": "recipient"}, c.refused_recipient),
        Sample(f"{p}queue_dropped_total", {}, c.queue_dropped),
        Sample(f"{p}errors_total", {}, c.errors),
        Sample(f"{p}queued_rumours", {}, stats.queued_rumours),
        Sample(f"{p}retained_deltas", {}, stats.retained_deltas),
        Sample(f"{p}retained_bytes", {}, stats.retained_bytes),
        Sample(f"{p}load_origins", {}, stats.load_origins),
        Sample(f"{p}incarnation", {}, stats.incarnation),
    ]
    out += [
        Sample(f"{p}convergence_lag_seconds", {"origin": o}, lag)
        for o, lag in stats.convergence_lag.items()
    ]
    return out


def copy_counters(c: Counters) -> Counters:
    """A detached copy (the node keeps counting into the original)."""
    return Counters(**{f.name: getattr(c, f.name) for f in fields(c)})
