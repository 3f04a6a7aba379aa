"""Discrete-event replay of a workload through the routing core and a fleet of engine models.

Each policy runs the same requests, at the same arrival times, through the request life the
gateway drives (``RoutingCore``: decide, acquire, record at the first token, release at the
end) into N engines (``engine_model``): a prefix cache of the given
capacity and an FCFS timing model. A pooled reference runs them into one engine with N times the
cache, compute and slots: the hit ratio a perfect router over the same hardware could reach.

The router's index is given each engine's true capacity (an operator who set
``engine_capacity_tokens`` right). The engine model says when a request's first token leaves
(the router records its blocks then, as the gateway does on the first byte) and when it
finishes (its load is released). ``decision_us`` is the CPU time of ``decide`` and ``acquire``,
read from the clock the caller hands in (``cpu_clock``; the core reads no clock of its own).

What the router does not control (``Outside``): a seeded share of the requests goes straight
to the engines, round-robin, as clients that skip the router would (the engines cache them; an
approximate index never hears of them), and engine 0 may restart part-way (its cache emptied;
an approximate index still believes in it). With ``precise`` the router's index is fed the
engines' own word instead, as their KV cache events do live: every admission's blocks stored
and evicted, and the restart's clear, applied at once. Keys in that feed stand for token-exact
keys: one id per engine block (the block's own chained key, cut to 32 bits), keyed with
``token_keys`` at a block size of one id, so ``RoutingCore``'s precise path runs as it does
live, without a tokenizer. The pooled reference is not restarted (there is no quarter of one
engine to clear) and takes the bypassed requests like any other.

With ``Fleet.report_interval`` set, every engine reports its running and waiting requests and
its KV use (``engine_model.Occupancy``) to the core's ``LoadBook`` every that many seconds, as
the gateway's /metrics scraper does: each decision sees a report up to one interval old,
blended with what the router sent since.

With ``Fleet.replicas`` (``Replicas``), several routing cores share the requests in turns, as
replicas behind one Service do, and learn of each other as gossip tells them live: each
replica's deltas (a record's blocks) and load reports (its in-flight figures and hottest
prefixes, every ``load_interval``) reach its peers ``lag`` seconds later.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from router.core.blocks import CHARS_PER_TOKEN, token_keys
from router.core.decision import CoreSettings, Lease, RoutingCore
from router.core.engine_blocks import Change
from router.core.engine_model import EngineClock, EngineSpec, Occupancy, PrefixCache
from router.core.index import Delta
from router.core.load import HOT_PREFIXES, EngineReport, Load
from router.core.policy import Policy
from router.core.precise import TokenPrompt
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
class Outside:
    """What reaches the engines without the router: bypass traffic and an engine restart."""

    bypass_share: float = 0.0  # of the requests, seeded, sent round-robin to the engines
    restart_at: float | None = None  # engine 0 restarts when this share of requests is due
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.bypass_share < 1:
            raise ValueError("the bypass share must be from 0 to below 1")
        if self.restart_at is not None and not 0 <= self.restart_at <= 1:
            raise ValueError("the restart point must be a share of the trace, from 0 to 1")

    def bypass(self, requests: int, engines: int) -> list[int | None]:
        """Per request, the engine it goes to straight (None: through the router)."""
        rng = random.Random(self.seed)
        turn = 0
        out: list[int | None] = []
        for _ in range(requests):
            if rng.random() < self.bypass_share:
                out.append(turn % engines)
                turn += 1
            else:
                out.append(None)
        return out


@dataclass(frozen=True, slots=True)
class Replicas:
    """Router replicas taking the requests in turns and hearing of each other ``lag`` late."""

    count: int = 1
    # Seconds from a replica's delta or load report to its peers' books. Live, on one busy
    # host, a peer's load figures were about 10 ms behind (bench/RESULTS.md, "Several replicas:
    # the load they see of each other").
    lag: float = 0.01
    # Seconds between one replica's load reports (gossip's local preset).
    load_interval: float = 0.05

    def __post_init__(self) -> None:
        if self.count < 1 or self.lag < 0 or self.load_interval < 0:
            raise ValueError("replicas must be at least 1, their lag and interval 0 or more")


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
    outside: Outside = field(default_factory=Outside)
    replicas: Replicas = field(default_factory=Replicas)


def _block_ids(engine_keys: Sequence[int]) -> list[int]:
    # One id per engine block: the block's chained key (which names its whole prefix), cut to
    # the 32 bits of a token id.
    return [k & 0xFFFFFFFF for k in engine_keys]


class _Events:
    """The engines' KV cache events as a precise router receives them (no wire, no delay)."""

    def __init__(self, cores: Sequence[RoutingCore], names: Sequence[str]) -> None:
        self.cores = cores  # every replica subscribes to every engine's events
        # engine -> its block key -> the router's key for it (for removals)
        self._keys: dict[str, dict[int, int]] = {name: {} for name in names}
        for core in cores:
            for name in names:
                core.set_precise(name, 1)

    def _observe(self, engine: str, change: Change, now: float) -> None:
        for core in self.cores:
            core.observe(engine, change, now)

    def admitted(
        self, engine: str, keys: Sequence[int], evicted: Sequence[int], now: float
    ) -> None:
        """``engine`` cached a prompt's blocks ``keys``, evicting ``evicted``."""
        known = self._keys[engine]
        gone = [k for e in evicted if (k := known.pop(e, None)) is not None]
        if gone:
            self._observe(engine, Change(removed=tuple(gone)), now)
        stored = token_keys(_block_ids(keys), 1)
        known.update(zip(keys, stored, strict=True))
        if stored:
            self._observe(engine, Change(stored=tuple(stored)), now)

    def cleared(self, engine: str, now: float) -> None:
        self._keys[engine].clear()
        self._observe(engine, Change(cleared=True), now)


# A replica's load report: its in-flight figures per engine and its hottest prefixes.
_Report = tuple[dict[str, Load], dict[int, int]]


class _Gossip:
    """What each replica tells the others, delivered ``lag`` after it was said."""

    def __init__(self, cores: Sequence[RoutingCore], replicas: Replicas) -> None:
        self.cores = cores
        self.lag = replicas.lag
        self.interval = replicas.load_interval
        self._next_report = 0.0
        self._said = 0  # ties in the queue go in the order said
        # (due, said, replica, a delta or a load report)
        self._queue: list[tuple[float, int, int, Delta | _Report]] = []

    def _say(self, replica: int, news: Delta | _Report, now: float) -> None:
        self._said += 1
        heapq.heappush(self._queue, (now + self.lag, self._said, replica, news))

    def delta(self, replica: int, delta: Delta | None, now: float) -> None:
        if delta is not None and len(self.cores) > 1:
            self._say(replica, delta, now)

    def loads_due(self, now: float) -> None:
        """Each replica's load report, when one is due (interval 0: before every decision)."""
        if len(self.cores) < 2 or now < self._next_report:
            return
        for r, core in enumerate(self.cores):
            self._say(r, (core.loads.local_all(), core.loads.hottest(HOT_PREFIXES)), now)
        self._next_report = now + self.interval

    def deliver(self, now: float) -> None:
        """Everything said up to ``now`` less the lag reaches every other replica."""
        q = self._queue
        while q and q[0][0] <= now:
            at, _, source, news = heapq.heappop(q)
            origin = self.cores[source].origin
            for r, core in enumerate(self.cores):
                if r == source:
                    continue
                if isinstance(news, Delta):
                    core.index.apply(news, at)
                else:
                    core.loads.peer_report(origin, *news)


class SimEngine:
    """One simulated engine: its prefix cache, its clock, and what it reports of itself."""

    __slots__ = ("cache", "clock", "occupancy")

    def __init__(self, spec: EngineSpec, block_tokens: int) -> None:
        self.cache = PrefixCache(spec.capacity_tokens, block_tokens)
        self.clock = EngineClock(spec)
        self.occupancy = Occupancy(spec)


def report_loads(core: RoutingCore, engines: Mapping[str, SimEngine], now: float) -> None:
    """Every engine's running and waiting requests and KV use, as the gateway scrapes them."""
    for name, eng in engines.items():
        running, waiting, usage = eng.occupancy.report(now)
        core.loads.engine_report(name, EngineReport(running, waiting, usage), now)


def _untimed() -> int:
    return 0


def engine_block_tokens(trace: Sequence[TraceRequest]) -> int:
    return trace[0].engine_block_tokens if trace else 16


def _summarise(
    name: str,
    engines: Sequence[SimEngine],
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
    *,
    precise: bool = False,
    cpu_clock: Callable[[], int] | None = None,
) -> SimResult:
    """Replay ``trace`` through ``policy`` on ``fleet`` (``precise``: fed the engines' events).

    ``cpu_clock``: nanoseconds of CPU time, to time each decision (None: not timed, 0).
    """
    names = [f"engine-{i}" for i in range(fleet.engines)]
    every = fleet.report_interval
    settings = CoreSettings(stale_after=every * fleet.stale_after_intervals)
    cores = [RoutingCore(policy, f"replica-{r}", settings) for r in range(fleet.replicas.count)]
    for core in cores:
        core.set_engines(dict.fromkeys(names, 1))
        for name in names:
            core.index.add_engine(name, max(1, fleet.spec.capacity_tokens // policy.block_tokens))
    gossip = _Gossip(cores, fleet.replicas)
    bt = engine_block_tokens(trace)
    engines = {name: SimEngine(fleet.spec, bt) for name in names}
    events = _Events(cores, names) if precise else None
    outside = fleet.outside
    bypass = outside.bypass(len(trace), len(names))
    restart = -1 if outside.restart_at is None else int(outside.restart_at * len(trace))
    next_report = 0.0
    due: list[tuple[float, int, int, Lease]] = []  # (time, kind, request, lease)
    ttfts: list[float] = []
    decision_ns: list[int] = []
    prompt = cached = 0
    clock = cpu_clock or _untimed
    for i, req in enumerate(trace):
        now = req.timestamp / fleet.speedup
        while due and due[0][0] <= now:
            at, kind, j, ending = heapq.heappop(due)
            gossip.deliver(at)
            owner = j % len(cores)
            if kind == _FIRST_TOKEN:
                gossip.delta(owner, cores[owner].record(ending, at), at)
            else:
                cores[owner].release(ending)
        gossip.loads_due(now)
        gossip.deliver(now)
        core = cores[i % len(cores)]
        if every > 0 and now >= next_report:
            for c in cores:
                report_loads(c, engines, now)
            next_report = now + every
        if i == restart:
            engines[names[0]].cache.clear()
            if events is not None:
                events.cleared(names[0], now)
        lease: Lease | None = None
        straight = bypass[i]
        if straight is None:
            body = req.request_body()
            t0 = clock()
            tokenized = None
            if events is not None:
                ids = _block_ids(req.engine_keys)
                tokenized = TokenPrompt(ids, text_chars=len(ids) * bt * CHARS_PER_TOKEN)
            d = core.decide(body, names, now, req.session, req.prompt_tokens, tokenized=tokenized)
            assert d.engine is not None  # every engine is a candidate
            lease = core.acquire(d, d.engine, now)
            decision_ns.append(clock() - t0)
            name = d.engine
        else:
            name = names[straight]
        engine = engines[name]
        hit, evicted = engine.cache.admit(req.engine_keys, req.prompt_tokens, now)
        if events is not None:
            events.admitted(name, req.engine_keys, evicted, now)
        sched = engine.clock.admit(now, req.prompt_tokens - hit, req.output_tokens)
        if every > 0:
            engine.occupancy.add(sched, req.prompt_tokens, hit)
        if lease is not None:
            heapq.heappush(due, (sched.first_token, _FIRST_TOKEN, i, lease))
            heapq.heappush(due, (sched.done, _DONE, i, lease))
        ttfts.append(sched.ttft)
        prompt += req.prompt_tokens
        cached += hit
        if progress is not None and i % 256 == 0:
            progress(policy.name, i, len(trace))
    name = f"{policy.name} (precise)" if precise else policy.name
    if progress is not None:
        progress(name, len(trace), len(trace))
    return _summarise(name, list(engines.values()), prompt, cached, ttfts, decision_ns)


def simulate_pooled(
    trace: Sequence[TraceRequest], fleet: Fleet, progress: Progress | None = None
) -> SimResult:
    """Replay ``trace`` on one engine with the whole fleet's cache, compute and slots."""
    engine = SimEngine(fleet.spec.pooled(fleet.engines), engine_block_tokens(trace))
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
    indexes: Sequence[str] = ("approximate",),
    cpu_clock: Callable[[], int] | None = None,
) -> list[SimResult]:
    """One result per policy and index (``approximate``, ``precise``), then the pooled
    reference; ``cpu_clock`` times the decisions (see ``simulate_policy``)."""
    results = [
        simulate_policy(p, trace, fleet, progress, precise=index == "precise", cpu_clock=cpu_clock)
        for p in policies
        for index in indexes
    ]
    results.append(simulate_pooled(trace, fleet, progress))
    return results
