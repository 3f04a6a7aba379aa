"""What ``kvrouter top`` shows, computed from what routers' public endpoints answered; no I/O.

``sample`` turns one router's answers (``/metrics`` as Prometheus text, ``/ready``,
``/v1/models`` and, with the admin token, ``/debug/backends``) into a ``RouterSample``;
``fleet_view`` merges the samples of one refresh from every router watched (the replicas of a
gossiping fleet each count their own in-flight requests and attempts, which add up; what an
engine reports of itself is the same engine's figure on each, so the freshest is kept) and,
with the previous refresh, turns counters into rates. Series a router does not export (an
older version, or a metric another build adds) stay None, shown as "-".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Sort orders, cycled by a key: each a column of the table.
SORTS = ("engine", "inflight", "req/s", "waiting", "kv")
# KV usage from which a row is in trouble: the router's own full mark
# (flow_control.engine_kv_usage_threshold) and a warning some way below it.
KV_WARN = 0.9
KV_FULL = 0.98

Samples = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One engine as one router sees it."""

    url: str
    healthy: bool
    state: str = ""  # healthy, pending, ejected (from /debug/backends); "" when not given
    models: tuple[str, ...] = ()  # () when not given
    inflight: float = 0.0
    running: float | None = None  # what the engine reports of itself
    waiting: float | None = None
    kv_usage: float | None = None
    attempts: float = 0.0  # kvrouter_backend_requests_total over every code
    failed: float = 0.0  # of those, errors, timeouts and 5xx
    reachable: float | None = None  # kvrouter_prefix_reachable_tokens_total{engine}
    achieved: float | None = None  # kvrouter_prefix_achieved_tokens_total{engine}


@dataclass(frozen=True, slots=True)
class RouterSample:
    """One router's answers at one refresh (``error``: why it could not be read)."""

    url: str
    at: float
    error: str = ""
    ready: bool = False
    policy: str = ""
    models: tuple[str, ...] = ()
    engines: Mapping[str, EngineSample] = field(default_factory=dict)
    requests: float = 0.0
    queued: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    reachable: float | None = None
    achieved: float | None = None


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> sample name -> [(labels, value)]; a malformed text gives {}."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[s.name].append((dict(s.labels), float(s.value)))
    except ValueError:
        return {}
    return dict(out)


def _by(samples: Samples, name: str, label: str) -> dict[str, float] | None:
    """``name``'s values summed by ``label``; None when the router exports no such series."""
    if name not in samples:
        return None
    out: dict[str, float] = defaultdict(float)
    for labels, v in samples[name]:
        if label in labels:
            out[labels[label]] += v
    return dict(out)


def _total(samples: Samples, name: str) -> float | None:
    return sum(v for _, v in samples[name]) if name in samples else None


def _failed_code(code: str) -> bool:
    return not code.isdigit() or code.startswith("5")


def sample(
    url: str,
    at: float,
    metrics: str,
    ready: Mapping[str, Any] | None = None,
    models: Mapping[str, Any] | None = None,
    backends: Mapping[str, Any] | None = None,
) -> RouterSample:
    """One router's ``RouterSample`` from its endpoints' answers (None: not answered)."""
    m = parse_metrics(metrics)
    if not m:
        return RouterSample(url, at, error="no metrics")
    healthy = _by(m, "kvrouter_backend_healthy", "backend") or {}
    inflight = _by(m, "kvrouter_backend_inflight_requests", "backend") or {}
    kv = _by(m, "kvrouter_backend_kv_usage", "backend") or {}
    running: dict[str, float] = {}
    waiting: dict[str, float] = {}
    for labels, v in m.get("kvrouter_backend_reported_requests", ()):
        into = running if labels.get("state") == "running" else waiting
        into[labels.get("backend", "")] = v
    attempts: dict[str, float] = defaultdict(float)
    failed: dict[str, float] = defaultdict(float)
    for labels, v in m.get("kvrouter_backend_requests_total", ()):
        engine = labels.get("backend", "")
        attempts[engine] += v
        if _failed_code(labels.get("code", "")):
            failed[engine] += v
    reachable = _by(m, "kvrouter_prefix_reachable_tokens_total", "engine")
    achieved = _by(m, "kvrouter_prefix_achieved_tokens_total", "engine")
    listed = _backends(backends)
    engines = {}
    for e in sorted(set(healthy) | set(listed)):
        state, served = listed.get(e, ("", ()))
        engines[e] = EngineSample(
            url=e,
            healthy=state == "healthy" if state else healthy.get(e, 0.0) > 0,
            state=state,
            models=served,
            inflight=inflight.get(e, 0.0),
            running=running.get(e),
            waiting=waiting.get(e),
            kv_usage=kv.get(e),
            attempts=attempts.get(e, 0.0),
            failed=failed.get(e, 0.0),
            reachable=None if reachable is None else reachable.get(e, 0.0),
            achieved=None if achieved is None else achieved.get(e, 0.0),
        )
    return RouterSample(
        url=url,
        at=at,
        ready=bool(ready and ready.get("status") == "ready"),
        policy=str(ready.get("policy", "")) if ready else "",
        models=_model_ids(models),
        engines=engines,
        requests=_total(m, "kvrouter_requests_total") or 0.0,
        queued=_total(m, "kvrouter_queue_depth") or 0.0,
        prompt_tokens=_total(m, "kvrouter_prompt_tokens_total") or 0.0,
        cached_tokens=_total(m, "kvrouter_cached_tokens_total") or 0.0,
        reachable=_total(m, "kvrouter_prefix_reachable_tokens_total"),
        achieved=_total(m, "kvrouter_prefix_achieved_tokens_total"),
    )


def _model_ids(models: Mapping[str, Any] | None) -> tuple[str, ...]:
    data = models.get("data") if models else None
    if not isinstance(data, list):
        return ()
    return tuple(sorted({str(d["id"]) for d in data if isinstance(d, dict) and "id" in d}))


def _backends(body: Mapping[str, Any] | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """/debug/backends -> engine -> (state, models)."""
    rows = body.get("backends") if body else None
    if not isinstance(rows, list):
        return {}
    out = {}
    for b in rows:
        if isinstance(b, dict) and isinstance(b.get("url"), str):
            served = b.get("models")
            models = tuple(str(x) for x in served) if isinstance(served, list) else ()
            out[b["url"]] = (str(b.get("state", "")), models)
    return out


@dataclass(frozen=True, slots=True)
class Row:
    """One engine's line: merged over the routers watched."""

    engine: str
    health: str  # "healthy", the worst state seen, or "h/n healthy" when routers disagree
    healthy: bool
    inflight: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    rps: float | None  # attempts per second since the previous refresh
    failed_rps: float | None
    reachable: float | None
    achieved: float | None

    @property
    def got(self) -> float | None:
        """The share of the cache the router could reach that the engine did serve."""
        if self.reachable is None or self.achieved is None or self.reachable <= 0:
            return None
        return self.achieved / self.reachable

    def trouble(self) -> frozenset[str]:
        """The columns that show trouble: the row's health, load or failures."""
        out = set()
        if not self.healthy:
            out.add("health")
        if self.waiting:
            out.add("waiting")
        if self.kv_usage is not None and self.kv_usage >= KV_WARN:
            out.add("kv")
        if self.failed_rps:
            out.add("req/s")
        return frozenset(out)


@dataclass(frozen=True, slots=True)
class FleetView:
    """A refresh's whole picture: the routers, the fleet's totals and one row per engine."""

    routers: tuple[RouterSample, ...]
    rows: tuple[Row, ...]
    models: tuple[str, ...]
    rps: float | None
    queued: float
    hit_ratio: float | None  # cached / prompt tokens the engines reported
    reachable_ratio: float | None  # reachable / prompt tokens
    sort: str
    model: str | None
    engines_total: int  # before the model filter


def _rate(now: float, before: float | None, seconds: float) -> float | None:
    if before is None or seconds <= 0:
        return None
    return max(0.0, now - before) / seconds  # a restarted router counts from zero again


def fleet_view(
    current: Sequence[RouterSample],
    previous: Sequence[RouterSample] = (),
    *,
    sort: str = "engine",
    model: str | None = None,
) -> FleetView:
    """Merge one refresh of every router (and the one before, for rates) into a view."""
    before = {r.url: r for r in previous if not r.error}
    live = [r for r in current if not r.error]
    per_engine: dict[str, list[tuple[EngineSample, EngineSample | None, float]]] = {}
    rps: float | None = None
    for r in live:
        old = before.get(r.url)
        dt = r.at - old.at if old else 0.0
        if old is not None and dt > 0:
            rps = (rps or 0.0) + (_rate(r.requests, old.requests, dt) or 0.0)
        for url, e in r.engines.items():
            prior = old.engines.get(url) if old else None
            per_engine.setdefault(url, []).append((e, prior, dt))
    rows = [_row(url, seen) for url, seen in per_engine.items()]
    total = len(rows)
    if model is not None:
        served = {
            url for url, seen in per_engine.items() if any(model in e.models for e, _, _ in seen)
        }
        rows = [row for row in rows if row.engine in served]
    prompt = sum(r.prompt_tokens for r in live)
    reach = [r.reachable for r in live if r.reachable is not None]
    return FleetView(
        routers=tuple(current),
        rows=tuple(sorted(rows, key=_sort_key(sort))),
        models=tuple(sorted({m for r in live for m in r.models})),
        rps=rps,
        queued=sum(r.queued for r in live),
        hit_ratio=sum(r.cached_tokens for r in live) / prompt if prompt else None,
        reachable_ratio=sum(reach) / prompt if prompt and reach else None,
        sort=sort,
        model=model,
        engines_total=total,
    )


def _freshest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return known[-1] if known else None


def _summed(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _row(url: str, seen: list[tuple[EngineSample, EngineSample | None, float]]) -> Row:
    now = [e for e, _, _ in seen]
    ok = sum(1 for e in now if e.healthy)
    if ok == len(now):
        health = "healthy"
    elif ok == 0:
        health = next((e.state for e in now if e.state), "unhealthy")
    else:
        health = f"{ok}/{len(now)} healthy"
    rates = [
        (_rate(e.attempts, p.attempts, dt), _rate(e.failed, p.failed, dt))
        for e, p, dt in seen
        if p is not None
    ]
    return Row(
        engine=url,
        health=health,
        healthy=ok == len(now),
        inflight=sum(e.inflight for e in now),
        running=_freshest(e.running for e in now),
        waiting=_freshest(e.waiting for e in now),
        kv_usage=_freshest(e.kv_usage for e in now),
        rps=_summed(a for a, _ in rates),
        failed_rps=_summed(f for _, f in rates),
        reachable=_summed(e.reachable for e in now),
        achieved=_summed(e.achieved for e in now),
    )


def _sort_key(sort: str) -> Callable[[Row], tuple[float, str]]:
    """Busiest first for the load columns; by name otherwise (and to break ties)."""
    columns: dict[str, Callable[[Row], float]] = {
        "inflight": lambda r: r.inflight,
        "req/s": lambda r: r.rps or 0.0,
        "waiting": lambda r: r.waiting or 0.0,
        "kv": lambda r: r.kv_usage or 0.0,
    }
    column = columns.get(sort)
    if column is None:
        return lambda r: (0.0, r.engine)
    return lambda r: (-column(r), r.engine)


def next_of(options: Sequence[Any], current: Any) -> Any:
    """The option after ``current`` (the first after the last, or when it is not there)."""
    i = list(options).index(current) + 1 if current in options else 0
    return options[i % len(options)] if options else current
