"""Discrete-event replay of a workload through prefill/decode fleets of the same size.

Four fleets of ``PdFleet.engines`` engines take the same requests at the same times
(``pd_deciders``): the aggregated kv-aware fleet (every engine does both), and a fleet of
``prefill_engines`` prefill and ``decode_engines`` decode engines routed by kvrouter's
decision, by always splitting, and by llm-d's fixed threshold. Every request lives as the
gateway drives it through ``RoutingCore`` (decide, acquire, record at the first token, release
at the end), on engine models that stall decoding for prefill beside it
(``EngineSpec.decode_stall``).

A split request holds two leases, taken when it is decided: the prefill engine's, which
prefills the tokens it lacks, answers at its first token (recorded: it holds the prefix) and
ends there; and the decode engine's (``acquire(..., prefills=False)``). The decode engine hears
of the request when the prefill engine answers, as vLLM's proxies send it (so it holds no
batch slot while the prefill queues); its first token waits for a batch slot and the transfer
of the tokens it lacks itself (``DisaggSettings.transfer_seconds``), is recorded then (it holds
the blocks it received), and the lease is released when the last token is out. A whole
request lives as in ``simulator``. A request's end may move later after it is admitted (later
prefills stall it), so its release is re-queued when it falls due before its engine says it is
done.

Per fleet (``PdResult``): goodput, the requests per second that meet both objectives
(``Objectives``: time to first token and time per output token), the share that does, the hit
ratio (prompt tokens some engine did not have to prefill), TTFT and TPOT percentiles, and the
decisions by path and why.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from router.core.decision import CoreSettings, Lease, RoutingCore
from router.core.disaggregation import Disaggregated, DisaggSettings, Role
from router.core.engine_model import EngineSpec, Running
from router.core.pd_deciders import FLEETS, LLMD_THRESHOLD_TOKENS, decider
from router.core.policy import Policy
from router.core.simulator import SimEngine, engine_block_tokens, report_loads
from router.core.stats import percentile
from router.core.workload import TraceRequest

# Event kinds, in the order they run when due at the same time.
_FIRST_TOKEN, _DONE, _HANDOFF = 0, 1, 2

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Objectives:
    """A request counts towards goodput when it meets both: its first token within
    ``ttft_seconds`` plus ``ttft_per_token`` per prompt token (a long prompt is allowed its own
    prefill: 0 makes the objective one number), each later token within ``tpot_seconds``."""

    ttft_seconds: float = 2.0
    tpot_seconds: float = 0.1
    ttft_per_token: float = 0.0

    def __post_init__(self) -> None:
        if self.ttft_seconds <= 0 or self.tpot_seconds <= 0 or self.ttft_per_token < 0:
            raise ValueError("the TTFT and TPOT objectives must be above 0")

    def met(self, ttft: float, tpot: float, prompt_tokens: int) -> bool:
        budget = self.ttft_seconds + self.ttft_per_token * prompt_tokens
        return ttft <= budget and tpot <= self.tpot_seconds


@dataclass(frozen=True, slots=True)
class PdFleet:
    """``prefill_engines`` + ``decode_engines`` engines of one spec, and the link between."""

    prefill_engines: int
    decode_engines: int
    spec: EngineSpec = field(default_factory=lambda: EngineSpec(decode_stall=1.0))
    link: DisaggSettings = field(default_factory=DisaggSettings)
    speedup: float = 1.0
    report_interval: float = 0.5
    stale_after_intervals: int = 4
    threshold_tokens: int = LLMD_THRESHOLD_TOKENS

    def __post_init__(self) -> None:
        if self.prefill_engines < 1 or self.decode_engines < 1:
            raise ValueError("a disaggregated fleet needs at least one prefill and one decode")
        if self.speedup <= 0 or self.report_interval < 0 or self.threshold_tokens < 0:
            raise ValueError("speedup must be above 0; report interval and threshold >= 0")

    @property
    def engines(self) -> int:
        return self.prefill_engines + self.decode_engines

    def roles(self, name: str) -> dict[str, Role]:
        """The engines of the fleet decided by ``name``, with their roles."""
        if name == "aggregated":
            return {f"engine-{i}": "both" for i in range(self.engines)}
        out: dict[str, Role] = {f"prefill-{i}": "prefill" for i in range(self.prefill_engines)}
        out.update({f"decode-{i}": "decode" for i in range(self.decode_engines)})
        return out


@dataclass(frozen=True, slots=True)
class PdResult:
    """One fleet's replay; the field names are the ``--json`` contract."""

    fleet: str
    prefill_engines: int  # 0 for the aggregated fleet
    decode_engines: int  # 0 for the aggregated fleet
    link_gbps: float
    requests: int
    goodput: float  # requests per second meeting both objectives
    slo_attainment: float  # their share of the requests
    hit_ratio: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    split_share: float
    transfer_gb: float  # moved over the link, in all
    paths: dict[str, int]  # "path:why" -> requests

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Handoff:
    """A split request between its prefill engine's answer and its decode engine."""

    req: TraceRequest
    engine: str
    lease: Lease
    index: int  # the request's place in the replay


class _Replay:
    """One fleet's engines, core and pending events."""

    def __init__(self, policy: Policy, fleet: PdFleet, roles: Mapping[str, Role], bt: int):
        every = fleet.report_interval
        self.fleet = fleet
        self.core = RoutingCore(
            policy, settings=CoreSettings(stale_after=every * fleet.stale_after_intervals)
        )
        self.core.set_engines(dict.fromkeys(roles, 1))
        for name in roles:
            self.core.index.add_engine(
                name, max(1, fleet.spec.capacity_tokens // policy.block_tokens)
            )
        self.engines = {name: SimEngine(fleet.spec, bt) for name in roles}
        self.due: list[tuple[float, int, int, Lease, Running | _Handoff]] = []
        self._seq = itertools.count()
        self.runs: list[Running | None] = []  # per request, its answering engine's run
        self.prompt = self.cached = self.moved = 0

    def _push(self, at: float, kind: int, lease: Lease, item: Running | _Handoff) -> None:
        heapq.heappush(self.due, (at, kind, next(self._seq), lease, item))

    def _expect(self, run: Running, lease: Lease) -> None:
        self._push(run.first_token, _FIRST_TOKEN, lease, run)
        self._push(run.done, _DONE, lease, run)

    def until(self, now: float) -> None:
        """Run the events due by ``now``: first tokens recorded, ended requests released,
        answered prefills handed to their decode engines."""
        due = self.due
        while due and due[0][0] <= now:
            at, kind, _, lease, item = heapq.heappop(due)
            if isinstance(item, _Handoff):
                self._receive(item, at)
            elif kind == _FIRST_TOKEN:
                self.core.record(lease, at)
            elif item.done > at:  # stalled since it was admitted: it ends later
                self._push(item.done, _DONE, lease, item)
            else:
                self.core.release(lease)

    def _admit(self, engine: str, req: TraceRequest, now: float) -> tuple[SimEngine, int]:
        eng = self.engines[engine]
        hit, _ = eng.cache.admit(req.engine_keys, req.prompt_tokens, now)
        return eng, hit

    def whole(self, route: Disaggregated, req: TraceRequest, now: float) -> None:
        d, engine = route.decision, route.engine
        assert d is not None and engine is not None  # every fleet has an engine for it
        lease = self.core.acquire(d, engine, now)
        eng, hit = self._admit(engine, req, now)
        run = eng.clock.start(now, req.prompt_tokens - hit, req.output_tokens)
        self._held(eng, run, req, hit)
        self._expect(run, lease)
        self.cached += hit
        self.runs.append(run)

    def split(self, route: Disaggregated, req: TraceRequest, now: float) -> None:
        p_name, d_name = route.prefill_engine, route.engine
        assert route.prefill is not None and route.decode is not None
        assert p_name is not None and d_name is not None
        core = self.core
        p_lease = core.acquire(route.prefill, p_name, now)
        d_lease = core.acquire(route.decode, d_name, now, prefills=False)
        p, hit = self._admit(p_name, req, now)
        answered = p.clock.start(now, req.prompt_tokens - hit, 0)
        self._held(p, answered, req, hit)
        self._expect(answered, p_lease)
        self.cached += hit
        # The decode engine hears of it when the prefill engine answers (vLLM's proxies).
        handoff = _Handoff(req, d_name, d_lease, len(self.runs))
        self._push(answered.first_token, _HANDOFF, d_lease, handoff)
        self.runs.append(None)

    def _receive(self, h: _Handoff, at: float) -> None:
        d, held = self._admit(h.engine, h.req, at)
        lacks = h.req.prompt_tokens - held
        secs = self.fleet.link.transfer_seconds(lacks)
        run = d.clock.receive(at, at, secs, h.req.output_tokens)
        self._held(d, run, h.req, held)
        self._expect(run, h.lease)
        self.moved += self.fleet.link.transfer_bytes(lacks)
        self.runs[h.index] = run

    def _held(self, eng: SimEngine, run: Running, req: TraceRequest, cached: int) -> None:
        if self.fleet.report_interval > 0:
            eng.occupancy.add(run, req.prompt_tokens, cached)


def simulate_fleet(
    name: str,
    policy: Policy,
    trace: Sequence[TraceRequest],
    fleet: PdFleet,
    objectives: Objectives,
    progress: Progress | None = None,
) -> PdResult:
    """Replay ``trace`` through the fleet decided by ``name`` (one of ``FLEETS``)."""
    rule = decider(name, fleet.link, fleet.threshold_tokens)
    roles = fleet.roles(name)
    names = list(roles)
    replay = _Replay(policy, fleet, roles, engine_block_tokens(trace))
    every = fleet.report_interval
    next_report = 0.0
    paths: Counter[str] = Counter()
    for i, req in enumerate(trace):
        now = req.timestamp / fleet.speedup
        replay.until(now)
        if every > 0 and now >= next_report:
            report_loads(replay.core, replay.engines, now)
            next_report = now + every
        body = req.request_body()
        route = rule(replay.core, body, roles, names, now, req.session, req.prompt_tokens)
        paths[f"{route.path}:{route.why}"] += 1
        if route.path == "split":
            replay.split(route, req, now)
        else:
            replay.whole(route, req, now)
        replay.prompt += req.prompt_tokens
        if progress is not None and i % 256 == 0:
            progress(name, i, len(trace))
    replay.until(float("inf"))
    assert replay.core.outstanding == 0, "every lease is released"
    if progress is not None:
        progress(name, len(trace), len(trace))
    runs = [r for r in replay.runs if r is not None]
    assert len(runs) == len(trace), "every request answered"
    return _result(name, fleet, trace, runs, replay, paths, objectives)


def _result(
    name: str,
    fleet: PdFleet,
    trace: Sequence[TraceRequest],
    runs: Sequence[Running],
    replay: _Replay,
    paths: Counter[str],
    objectives: Objectives,
) -> PdResult:
    ttfts = [
        r.first_token - req.timestamp / fleet.speedup for r, req in zip(runs, trace, strict=True)
    ]
    tpots = [r.tpot for r in runs]
    met = sum(
        1
        for a, b, req in zip(ttfts, tpots, trace, strict=True)
        if objectives.met(a, b, req.prompt_tokens)
    )
    span = (trace[-1].timestamp - trace[0].timestamp) / fleet.speedup if trace else 0.0
    split = sum(n for k, n in paths.items() if k.startswith("split:"))
    pooled = name == "aggregated"
    return PdResult(
        fleet=name,
        prefill_engines=0 if pooled else fleet.prefill_engines,
        decode_engines=0 if pooled else fleet.decode_engines,
        link_gbps=fleet.link.link_gbps,
        requests=len(runs),
        goodput=met / span if span > 0 else float(met),
        slo_attainment=met / len(runs) if runs else 0.0,
        hit_ratio=replay.cached / replay.prompt if replay.prompt else 0.0,
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        tpot_p50=percentile(tpots, 50),
        tpot_p99=percentile(tpots, 99),
        split_share=split / len(runs) if runs else 0.0,
        transfer_gb=replay.moved / 1e9,
        paths=dict(sorted(paths.items())),
    )


def simulate_pd(
    policy: Policy,
    trace: Sequence[TraceRequest],
    fleet: PdFleet,
    objectives: Objectives | None = None,
    progress: Progress | None = None,
    names: Sequence[str] = FLEETS,
) -> list[PdResult]:
    """One result per fleet in ``names`` (all four by default), in that order."""
    goal = objectives or Objectives()
    return [simulate_fleet(n, policy, trace, fleet, goal, progress) for n in names]
