"""Discrete-event replay of a workload through the routing core and a fleet of engine models.

Each policy runs the same requests, at the same arrival times, through the request life the
gateway drives (``RoutingCore``: decide, acquire, record at the first token, release at the
end) into N engines (``engine_model``): a prefix cache of the given
capacity and an FCFS timing model. A pooled reference runs them into one engine with N times the
cache, compute and slots: the hit ratio a perfect router over the same hardware could reach.

The router's index is given each engine's true capacity (an operator who set
``engine_capacity_tokens`` right). The engine model says when a request's first token leaves
(the router records its blocks then, as the gateway does on the first byte) and when it
finishes (its load is released). ``decision_us`` is the CPU time of ``decide`` and ``acquire``.

With ``Fleet.report_interval`` set, every engine reports its running and waiting requests and
its KV use (``engine_model.Occupancy``) to the core's ``LoadBook`` every that many seconds, as
the gateway's /metrics scraper does: each decision sees a report up to one interval old,
blended with what the router sent since.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from router.core.decision import Lease, RoutingCore
from router.core.engine_model import EngineClock, EngineSpec, Occupancy, PrefixCache
from router.core.load import EngineReport
from router.core.policy import Policy
from router.core.stats import percentile
from router.core.workload import TraceRequest

POOLED = "pooled-reference"

# Event kinds, in the order they run when due at the same time.
_FIRST_TOKEN, _DONE = 0, 1

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class SimResult:
    """One policy's replay; the field names are the ``--json`` contract."""

    policy: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_ratio: float
    ttft_p50: float
    ttft_p99: float
    load_imbalance: float
    decision_us_p50: float
    decision_us_p99: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Fleet:
    """N engines of one spec (``capacity_tokens`` per engine) and the replay speed-up."""

    engines: int
    spec: EngineSpec
    speedup: float = 1.0
    # Seconds between engine reports (0: engines report nothing; the router sees its own).
    report_interval: float = 0.0
    # A report older than this many intervals is ignored, as the gateway's default does.
    stale_after_intervals: int = 4


class _Engine:
    __slots__ = ("cache", "clock", "occupancy")

    def __init__(self, spec: EngineSpec, block_tokens: int) -> None:
        self.cache = PrefixCache(spec.capacity_tokens, block_tokens)
        self.clock = EngineClock(spec)
        self.occupancy = Occupancy(spec)


def _block_tokens(trace: Sequence[TraceRequest]) -> int:
    return trace[0].engine_block_tokens if trace else 16


def _summarise(
    name: str,
    engines: Sequence[_Engine],
    prompt: int,
    cached: int,
    ttfts: list[float],
    decision_ns: list[int],
) -> SimResult:
    busy = [e.clock.busy_seconds for e in engines]
    mean = sum(busy) / len(busy) if busy else 0.0
    return SimResult(
        policy=name,
        requests=len(ttfts),
        prompt_tokens=prompt,
        cached_tokens=cached,
        hit_ratio=cached / prompt if prompt else 0.0,
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        load_imbalance=max(busy) / mean if mean > 0 else 1.0,
        decision_us_p50=percentile(decision_ns, 50) / 1000.0,
        decision_us_p99=percentile(decision_ns, 99) / 1000.0,
    )


def simulate_policy(
    policy: Policy,
    trace: Sequence[TraceRequest],
    fleet: Fleet,
    progress: Progress | None = None,
) -> SimResult:
    """Replay ``trace`` through ``policy`` on ``fleet``."""
    names = [f"engine-{i}" for i in range(fleet.engines)]
    core = RoutingCore(policy)
    core.set_engines(dict.fromkeys(names, 1))
    for name in names:
        core.index.add_engine(name, max(1, fleet.spec.capacity_tokens // policy.block_tokens))
    bt = _block_tokens(trace)
    engines = {name: _Engine(fleet.spec, bt) for name in names}
    every = fleet.report_interval
    core.loads.stale_after = every * fleet.stale_after_intervals
    next_report = 0.0
    due: list[tuple[float, int, int, Lease]] = []  # (time, kind, request, lease)
    ttfts: list[float] = []
    decision_ns: list[int] = []
    prompt = cached = 0
    clock = time.thread_time_ns
    for i, req in enumerate(trace):
        now = req.timestamp / fleet.speedup
        while due and due[0][0] <= now:
            at, kind, _, lease = heapq.heappop(due)
            if kind == _FIRST_TOKEN:
                core.record(lease, at)
            else:
                core.release(lease)
        if every > 0 and now >= next_report:
            for name, eng in engines.items():
                running, waiting, usage = eng.occupancy.report(now)
                core.loads.engine_report(name, EngineReport(running, waiting, usage), now)
            next_report = now + every
        body = req.request_body()
        t0 = clock()
        d = core.decide(body, names, now, session=req.session, prompt_tokens=req.prompt_tokens)
        assert d.engine is not None  # every engine is a candidate
        lease = core.acquire(d, d.engine, now)
        decision_ns.append(clock() - t0)
        engine = engines[d.engine]
        hit = engine.cache.lookup_and_insert(req.engine_keys, req.prompt_tokens, now)
        sched = engine.clock.admit(now, req.prompt_tokens - hit, req.output_tokens)
        if every > 0:
            engine.occupancy.add(sched, req.prompt_tokens, hit)
        heapq.heappush(due, (sched.first_token, _FIRST_TOKEN, i, lease))
        heapq.heappush(due, (sched.done, _DONE, i, lease))
        ttfts.append(sched.ttft)
        prompt += req.prompt_tokens
        cached += hit
        if progress is not None and i % 256 == 0:
            progress(policy.name, i, len(trace))
    if progress is not None:
        progress(policy.name, len(trace), len(trace))
    return _summarise(policy.name, list(engines.values()), prompt, cached, ttfts, decision_ns)


def simulate_pooled(
    trace: Sequence[TraceRequest], fleet: Fleet, progress: Progress | None = None
) -> SimResult:
    """Replay ``trace`` on one engine with the whole fleet's cache, compute and slots."""
    engine = _Engine(fleet.spec.pooled(fleet.engines), _block_tokens(trace))
    ttfts: list[float] = []
    prompt = cached = 0
    for i, req in enumerate(trace):
        now = req.timestamp / fleet.speedup
        hit = engine.cache.lookup_and_insert(req.engine_keys, req.prompt_tokens, now)
        ttfts.append(engine.clock.admit(now, req.prompt_tokens - hit, req.output_tokens).ttft)
        prompt += req.prompt_tokens
        cached += hit
        if progress is not None and i % 1024 == 0:
            progress(POOLED, i, len(trace))
    return _summarise(POOLED, [engine], prompt, cached, ttfts, [])


def simulate(
    policies: Sequence[Policy],
    trace: Sequence[TraceRequest],
    fleet: Fleet,
    progress: Progress | None = None,
) -> list[SimResult]:
    """One result per policy, then the pooled reference."""
    results = [simulate_policy(p, trace, fleet, progress) for p in policies]
    results.append(simulate_pooled(trace, fleet, progress))
    return results
