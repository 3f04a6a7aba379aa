"""kvrouter against SGLang's routers (the `bench` extra): overhead and live quality.

The peers: SGLang's router (sglang-router, ``sglang_router.launch_router``) and SMG, SGLang's
model gateway (smg, ``smg.launch_router``; its per-worker overload protection is switched off,
since engine-sim reports no load it reads). Every process runs on this machine on free
loopback ports and is stopped at the end, also on Ctrl-C, SIGTERM or an error. Two parts; with
neither flag, both run.

``--overhead``: ``--engines`` ``engine-sim --fast`` processes (no model delays: what is measured
is plumbing) behind nothing (direct: the client spreads requests over the engines itself) and
behind each of ``--overhead-routers`` (kvrouter's kv-aware preset, SGLang's router and SMG
with ``--policy cache_aware``), all started together. Streamed chat requests of
``--max-tokens`` tokens; with ``--pace``, the engines send them one decode step apart, each an
HTTP chunk of its own (as vLLM and SGLang do), which weighs the relay's cost per chunk
instead of its cost per request. The whole part runs ``--repeat`` times with fresh processes, the
routers' order rotated each time, because this small machine's noise is larger than some of
the differences measured.

1. latency: one request at a time on keep-alive connections, twice: interleaved (each
   request number sent through every path in turn, so drift in the machine's load hits every
   path alike) and back to back (``--requests`` through one path, then the next: what one
   client with one connection sees). TTFT is the time to the first ``data:`` bytes, "total"
   the time to the end of the stream; "added" is a path's percentile minus direct's in the
   same run. A proxy that writes the response head and the first event separately on a socket
   without TCP_NODELAY holds the event until the client acknowledges the head, and the client
   delays that ACK (~40 ms on Linux) once the connection is past its first exchanges: a fixed
   ~40 ms step in TTFT. Whether the client's ACK is delayed depends on the timing of the
   connection's traffic, so the step can show in one ordering of the paths and not another.
2. load: at each ``--concurrency``, ``--load-requests`` streamed requests per path, one path
   at a time; throughput, TTFT under load, failures, and the router's CPU time per request
   (utime + stime from /proc of the router process and all its descendants, before and
   after: the peers' launchers run their Rust routers inside the same process, but any
   child would be counted). CPU time is the figure least disturbed by other work on the
   machine; latency and throughput move with it.

``--baseline DIR`` adds kvrouter kv-aware run from another source tree (for example an
unpacked ``git archive`` of an older commit), to compare before and after in the same runs.

The report opens with the summary over the runs: each router's CPU per request in every run
and kvrouter's ratio to each peer's in the same run, and the TTFT each router adds at
concurrency 1 (interleaved); then each run's tables.

``--quality``: ``--engines-quality`` engine-sims with a timing model (``--prefill-tokens-per-s``,
``--decode-tokens-per-s``, ``--max-batch``) and a prefix cache small enough to be contended
(``--kv-capacity-tokens``), and the first ``--limit`` records of a Mooncake trace replayed open
loop at their own arrival times divided by ``--speedup``, so every router gets the same
offered load. One router per run, the engines reset (POST /reset) before each. engine-sim
counts tokens as kvrouter does, and a Mooncake record's text has one such token per trace token
(``router.core.workload``), so kv-aware's ``engine_capacity_tokens`` is the engines' capacity,
as an operator would set it. Outputs
are cut to ``--max-output-tokens`` (0: the trace's own) to keep the client's and routers'
per-token work small on a small machine; prefill, which the cache saves, is unchanged.
Reports the engines' prefix-cache hit ratio (GET /stats), TTFT at the client, throughput,
each engine's share of requests and of busy time (max / mean), the router's CPU per request
and failures. Busy time is the simulator's imbalance measure, from the engines' counters:
uncached prompt tokens / prefill rate + output tokens / decode rate.

``--replicas N`` runs each kvrouter (the baseline too) as N replicas gossiping on loopback
(``--gossip-preset local``), the client sending request i to replica i mod N, as a Service
spreads them; the router CPU column then sums the replicas'.

``--quality --hotspot`` replays the simulator's hotspot workload instead of a trace
(``router.core.workload.hotspot``, the records ``kvrouter simulate --hotspot`` runs: chat
requests to the chat endpoint, with their arrival times and output lengths): the simulator's
multi-tenant chat at ``--hotspot-rate`` requests/s (default 1 per engine, as the simulator's 8
at 8 engines), plus one document (25,000 characters: 6,250 tokens as kvrouter and engine-sim
count) in 20% of requests, 45% during the burst from 120 s to 240 s at 1.5x the rate, answered
at length; ``--hotspot-requests`` of them (default 375 per engine: about 315 s of trace time).
Time is compressed by ``--speedup`` (default 3) and the engines are the simulator's
(``EngineSpec``: 400,000 cache tokens, 10,000 prefill tokens/s, 40 decode tokens/s, max batch
32) that much faster, so every duration is the simulator's divided by ``--speedup`` (except
the routers' own clocks, such as kvrouter's 0.5 s scrape of the engines' /metrics, unless
``--scrape-interval`` sets it). Outputs are divided by ``--output-scale`` (default 8, 0 or 1:
as generated) and the decode rate with them: a request holds its batch slot as long as in the
simulator, while the client and the routers relay 8x fewer chunks.

    python -m bench.sglang_compare [--overhead] [--quality]
        [--engines 1] [--requests 300] [--load-requests 2000] [--concurrency 32 256]
        [--max-tokens 32] [--pace 0] [--repeat 3] [--overhead-routers ROUTER ...]
        [--baseline DIR]
        [--trace ../shared/data/conversation_trace.jsonl] [--limit 2000] [--speedup 6]
        [--engines-quality 4] [--kv-capacity-tokens 1000000] [--prefill-tokens-per-s 80000]
        [--decode-tokens-per-s 100] [--max-batch 16] [--max-output-tokens 64]
        [--hotspot [--hotspot-requests N] [--hotspot-rate R] [--output-scale 8]]
        [--routers ROUTER ...] [--replicas 1]

(Engine and replay defaults shown are the trace's; ``--hotspot`` has its own, above.)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import orjson

from bench.common import (
    GOSSIP_SECRET,
    LoadResult,
    Timing,
    alive_peers,
    chat_body,
    closed_loop,
    interleaved,
    read_stream,
    tree_cpu_seconds,
)
from router.commands.fleet import LOOPBACK, Proc, free_port, running, start_ready
from router.core.engine_model import EngineSpec
from router.core.stats import percentile
from router.core.workload import HotspotSpec, SyntheticSpec, TraceRequest, from_mooncake, hotspot
from router.presets import preset_text

MODEL = "sim-model"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
STARTUP_TIMEOUT_S = 60.0
# A replayed request that has not finished by then counts as failed (the engines are quick).
REQUEST_TIMEOUT_S = 300.0

KVROUTER_POLICIES = {"kvrouter kv-aware": "kv-aware", "kvrouter round-robin": "round-robin"}
SGLANG_POLICIES = {"sglang cache_aware": "cache_aware", "sglang round_robin": "round_robin"}
SMG_POLICIES = {"smg cache_aware": "cache_aware", "smg round_robin": "round_robin"}
ROUTERS = (*KVROUTER_POLICIES, *SGLANG_POLICIES, *SMG_POLICIES)
QUALITY_DEFAULT = ("kvrouter kv-aware", "kvrouter round-robin", "sglang cache_aware")
OVERHEAD_DEFAULT = ("kvrouter kv-aware", "sglang cache_aware", "smg cache_aware")
# kvrouter kv-aware from another source tree (--baseline): before and after, in one run.
BASELINE = "kvrouter baseline"


@dataclass(frozen=True)
class Peer:
    """How to launch one of SGLang's routers: its module (the `bench` extra) and flags."""

    label: str
    module: str
    flags: tuple[str, ...] = ()


SGLANG = Peer("SGLang's router", "sglang_router.launch_router")
# engine-sim reports none of the load SMG reads: its overload protection would only guess.
SMG = Peer("SMG", "smg.launch_router", ("--disable-worker-overload-protection",))


# -- processes -----------------------------------------------------------------------------


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def start_peer(peer: Peer, workers: Sequence[str], policy: str, tmp: Path) -> Proc:
    """``peer`` with ``policy`` in front of ``workers``; returns once all are healthy.

    Its Prometheus exporter is kept on loopback too, its per-request INFO logging is off (as
    kvrouter's is at ``--log-level warning``), and a short shutdown grace keeps stopping quick.
    """
    port = free_port()
    log_path = tmp / f"{peer.module.split('.')[0]}-{policy}-{port}.log"
    cmd = [
        sys.executable, "-m", peer.module,
        "--host", LOOPBACK, "--port", str(port),
        "--worker-urls", *workers,
        "--policy", policy,
        "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()),
        "--log-level", "warn",
        "--shutdown-grace-period-secs", "1",
        *peer.flags,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    proc = Proc(popen, port, log_path)
    try:
        _wait_peer_workers(peer, proc, len(workers))
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc


def _wait_peer_workers(peer: Peer, proc: Proc, n: int) -> None:
    # It answers /health before its workers are registered; GET /workers says when they are.
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{peer.label} exited early:\n{proc.log()}")
        try:
            workers = _get_json(f"{proc.url}/workers").get("workers", [])
            last = workers
            if sum(1 for w in workers if w.get("is_healthy")) >= n:
                return
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{peer.label}: {n} healthy workers not listed ({last})\n{proc.log()}")


def start_router(
    name: str,
    engines: Sequence[Proc],
    tmp: Path,
    policy_file: Path | None,
    checkout: Path | None = None,
    config: Path | None = None,
    extra: Sequence[str] = (),
) -> Proc:
    """Router ``name`` (one of ``ROUTERS``, or ``BASELINE`` from ``checkout``) before
    ``engines``; ``extra``: more ``kvrouter serve`` flags."""
    urls = [e.url for e in engines]
    if name in SGLANG_POLICIES:
        return start_peer(SGLANG, urls, SGLANG_POLICIES[name], tmp)
    if name in SMG_POLICIES:
        return start_peer(SMG, urls, SMG_POLICIES[name], tmp)
    preset = "kv-aware" if name == BASELINE else KVROUTER_POLICIES[name]
    policy = str(policy_file) if policy_file is not None else preset
    backends = [a for u in urls for a in ("--backend", u)]
    args = ["serve", "--host", LOOPBACK, *backends, "--policy", policy, "--log-level", "warning"]
    if config is not None:
        args += ["--config", str(config)]
    args += extra
    env = {"KVROUTER_GOSSIP_SECRET": GOSSIP_SECRET}  # for --replicas; never leaves loopback
    if name != BASELINE:
        return start_ready(args, tmp, ready_path="/ready", timeout=STARTUP_TIMEOUT_S, env=env)
    assert checkout is not None, "the baseline runs from a checkout"
    return start_ready(
        args,
        tmp,
        ready_path="/ready",
        timeout=STARTUP_TIMEOUT_S,
        cwd=checkout,
        env={**env, "PYTHONPATH": str(checkout)},
    )


def start_routers(
    name: str,
    engines: Sequence[Proc],
    tmp: Path,
    policy_file: Path | None,
    replicas: int,
    checkout: Path | None = None,
    config: Path | None = None,
) -> list[Proc]:
    """Router ``name``; a kvrouter as ``replicas`` replicas gossiping on loopback, each
    joining through the first (the first through the second), once all see each other."""
    if replicas == 1 or name in SGLANG_POLICIES or name in SMG_POLICIES:
        return [start_router(name, engines, tmp, policy_file, checkout, config)]
    ports = [free_port() for _ in range(replicas)]
    procs: list[Proc] = []
    try:
        for i, port in enumerate(ports):
            seed = ports[1] if i == 0 else ports[0]
            flags = ["--gossip-port", str(port), "--gossip-peer", f"{LOOPBACK}:{seed}"]
            flags += ["--gossip-preset", "local"]
            procs.append(start_router(name, engines, tmp, policy_file, checkout, config, flags))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(alive_peers(p) == replicas - 1 for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {replicas} replicas never all saw each other")
            time.sleep(0.1)
    except BaseException:
        for p in procs:
            p.stop(signal.SIGKILL)
        raise
    return procs


def start_engines(n: int, flags: Sequence[str], tmp: Path, procs: list[Proc]) -> list[Proc]:
    engines = []
    for _ in range(n):
        engines.append(start_ready(["engine-sim", "--host", LOOPBACK, *flags], tmp))
        procs.append(engines[-1])
    return engines


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so ``running`` stops every process on the way out."""
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- markdown ------------------------------------------------------------------------------


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


# -- part 1: overhead ----------------------------------------------------------------------


@dataclass
class OverheadResult:
    interleaved: dict[str, list[Timing]]
    back_to_back: dict[str, list[Timing]]
    load: list[tuple[int, str, LoadResult]]


async def _overhead(
    args: argparse.Namespace, engines: list[Proc], routers: dict[str, Proc]
) -> OverheadResult:
    def body_for(i: int) -> dict[str, object]:
        return chat_body(i, args.prompt_chars, args.max_tokens)

    def direct(i: int) -> str:
        return engines[i % len(engines)].url

    def fixed(url: str) -> Callable[[int], str]:
        return lambda _i: url

    paths: dict[str, Callable[[int], str]] = {"direct": direct}
    paths.update({name: fixed(p.url) for name, p in routers.items()})
    print(f"latency: {args.requests} requests through each of {len(paths)} paths", flush=True)
    mixed = await interleaved(paths, args.requests, body_for)
    alone: dict[str, list[Timing]] = {}
    for name, url_for in paths.items():
        alone.update(await interleaved({name: url_for}, args.requests, body_for))
    load: list[tuple[int, str, LoadResult]] = []
    for c in args.concurrency:
        for name, url_for in paths.items():
            router = routers.get(name)
            pid = router.popen.pid if router is not None else None
            cpu_of = (lambda p=pid: tree_cpu_seconds(p)) if pid is not None else None
            print(f"load: concurrency {c}, {name}", flush=True)
            r = await closed_loop(url_for, args.load_requests, c, body_for, cpu_of)
            load.append((c, name, r))
    return OverheadResult(mixed, alone, load)


def overhead_paths(args: argparse.Namespace) -> list[str]:
    """The routers measured: ``--overhead-routers``, then the baseline when one is given."""
    return [*args.overhead_routers, *([BASELINE] if args.baseline else [])]


def overhead_engine_flags(args: argparse.Namespace) -> list[str]:
    """engine-sim --fast, or with ``--pace``: tokens one decode step apart, no prefill time and
    no batch limit, so that every token is an HTTP chunk of its own, as real engines send."""
    if not args.pace:
        return ["--fast"]
    return ["--prefill-tokens-per-s", "1e12", "--decode-tokens-per-s", str(args.pace),
            "--max-batch", "100000"]  # fmt: skip


def engine_label(args: argparse.Namespace) -> str:
    if not args.pace:
        return "engine-sim --fast"
    return f"engine-sim at {args.pace:g} tokens/s per stream"


def run_overhead(args: argparse.Namespace, tmp: Path) -> str:
    runs: list[OverheadResult] = []
    names = overhead_paths(args)
    for n in range(args.repeat):
        order = names[n % len(names) :] + names[: n % len(names)]
        print(f"run {n + 1} of {args.repeat}: {', '.join(order)}", flush=True)
        with running([]) as procs:
            engines = start_engines(args.engines, overhead_engine_flags(args), tmp, procs)
            routers: dict[str, Proc] = {}
            for name in order:
                routers[name] = start_router(name, engines, tmp, None, args.baseline)
                procs.append(routers[name])
            runs.append(asyncio.run(_overhead(args, engines, routers)))
    return overhead_report(args, runs)


def latency_table(latency: Mapping[str, list[Timing]]) -> str:
    """TTFT and total time per path, and what each adds to direct's."""
    d_ttft = [t.ttft for t in latency["direct"]]
    d_total = [t.total for t in latency["direct"]]
    rows = []
    for name, timings in latency.items():
        ttft = [t.ttft for t in timings]
        total = [t.total for t in timings]
        rows.append(
            [
                name,
                ms(percentile(ttft, 50)),
                ms(percentile(ttft, 99)),
                ms(percentile(ttft, 50) - percentile(d_ttft, 50)),
                ms(percentile(ttft, 99) - percentile(d_ttft, 99)),
                ms(percentile(total, 50)),
                ms(percentile(total, 99)),
                ms(percentile(total, 50) - percentile(d_total, 50)),
            ]
        )
    head = [
        "path",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "added p50",
        "added p99",
        "total p50 ms",
        "total p99 ms",
        "added total p50",
    ]
    return table(head, rows)


def _cpu(r: OverheadResult, c: int, name: str) -> float | None:
    return next((lr.cpu_ms_per_request for cc, n, lr in r.load if cc == c and n == name), None)


def _cells(values: Sequence[float | None], fmt: str) -> str:
    return ", ".join("-" if v is None else format(v, fmt) for v in values)


def overhead_summary(args: argparse.Namespace, runs: Sequence[OverheadResult]) -> str:
    """Each router's CPU per request in every run, kvrouter's ratio to each peer in the same
    run, and the TTFT each router adds at concurrency 1."""
    names = overhead_paths(args)
    ours = [n for n in names if n in KVROUTER_POLICIES]
    peers = [n for n in names if n not in KVROUTER_POLICIES and n != BASELINE]
    pairs = [(k, p) for k in ours for p in peers]
    if args.baseline:
        pairs += [(k, BASELINE) for k in ours]
    rows = []
    for c in args.concurrency:
        cpu = {n: [_cpu(r, c, n) for r in runs] for n in names}
        ratios = [
            [a / b if a is not None and b else None for a, b in zip(cpu[k], cpu[p], strict=True)]
            for k, p in pairs
        ]
        rows.append(
            [str(c), *(_cells(cpu[n], ".3f") for n in names), *(_cells(r, ".2f") for r in ratios)]
        )
    head = ["concurrency", *names, *(f"{k} / {p}" for k, p in pairs)]
    cpu_table = table(head, rows)
    lat_rows = []
    for n in names:
        added = []
        for r in runs:
            direct = [t.ttft for t in r.interleaved["direct"]]
            mine = [t.ttft for t in r.interleaved[n]]
            added.append(
                (
                    percentile(mine, 50) - percentile(direct, 50),
                    percentile(mine, 99) - percentile(direct, 99),
                )
            )
        lat_rows.append(
            [
                n,
                _cells([a[0] * 1000 for a in added], ".2f"),
                _cells([a[1] * 1000 for a in added], ".2f"),
            ]
        )
    direct_p50 = _cells(
        [percentile([t.ttft for t in r.interleaved["direct"]], 50) * 1000 for r in runs], ".2f"
    )
    lat_table = table(["path", "added TTFT p50 ms", "added TTFT p99 ms"], lat_rows)
    return (
        f"Router CPU per streamed request, ms (one value per run, {args.load_requests} requests "
        f"each), and kvrouter's ratio to each peer in the same run:\n\n{cpu_table}\n\n"
        f"TTFT added at concurrency 1 (interleaved, {args.requests} requests per path; direct "
        f"TTFT p50 {direct_p50} ms), one value per run:\n\n{lat_table}\n"
    )


def overhead_report(args: argparse.Namespace, runs: Sequence[OverheadResult]) -> str:
    parts = [
        f"### Overhead: {args.engines} x {engine_label(args)}, streamed chat, "
        f"{args.prompt_chars}-char prompt, {args.max_tokens} tokens, {len(runs)} runs\n\n"
        f"{overhead_summary(args, runs)}"
    ]
    for n, r in enumerate(runs, 1):
        load_rows = []
        for c, name, lr in r.load:
            cpu = lr.cpu_ms_per_request
            load_rows.append(
                [
                    str(c),
                    name,
                    f"{lr.requests_per_s:.0f}",
                    "-" if cpu is None else f"{cpu:.3f}",
                    ms(percentile(lr.ttfts, 50)),
                    ms(percentile(lr.ttfts, 99)),
                    str(lr.failures),
                ]
            )
        load = table(
            ["concurrency", "path", "req/s", "router CPU ms/req", "TTFT p50 ms", "TTFT p99 ms",
             "fail"],
            load_rows,
        )  # fmt: skip
        parts.append(
            f"#### Run {n}\n\n"
            f"One request at a time, interleaved ({args.requests} per path):\n\n"
            f"{latency_table(r.interleaved)}\n\n"
            f"One request at a time, back to back ({args.requests} per path):\n\n"
            f"{latency_table(r.back_to_back)}\n\n"
            f"Closed loop, {args.load_requests} requests per row:\n\n{load}\n"
        )
    return "\n".join(parts)


# -- part 2: live routing quality on a trace -----------------------------------------------


def load_trace(path: Path, limit: int) -> list[TraceRequest]:
    """The first ``limit`` Mooncake records of ``path``."""
    out: list[TraceRequest] = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if len(out) >= limit:
                break
            if line.strip():
                out.append(from_mooncake(json.loads(line), f"{path.name}:{n}"))
    return out


# The hotspot's trace time per engine's worth of requests: 375 at 1 request/s per engine end
# 75 s after the burst (120 s at the rate, 120 s at 1.5x, 75 s at the rate).
HOTSPOT_REQUESTS_PER_ENGINE = 375
HOTSPOT_SPEEDUP = 3.0
HOTSPOT_OUTPUT_SCALE = 8
TRACE_DEFAULTS = {
    "speedup": 6.0,
    "kv_capacity_tokens": 1_000_000,
    "prefill_tokens_per_s": 80_000.0,
    "decode_tokens_per_s": 100.0,
    "max_batch": 16,
    "max_output_tokens": 64,
}


def resolve_quality(args: argparse.Namespace) -> None:
    """Fill the quality settings left unset with the workload's defaults.

    A trace keeps the settings its RESULTS tables ran with. The hotspot runs the simulator's
    engines ``--speedup`` times faster, and with outputs ``--output-scale`` times shorter, the
    decode rate that much slower per token, so that time in a batch slot is unchanged.
    """
    scale = max(1, args.output_scale)
    if args.hotspot:
        spec = EngineSpec()
        speedup = args.speedup or HOTSPOT_SPEEDUP
        defaults: dict[str, float] = {
            "speedup": speedup,
            "kv_capacity_tokens": spec.capacity_tokens,
            "prefill_tokens_per_s": spec.prefill_tokens_per_s * speedup,
            "decode_tokens_per_s": spec.decode_tokens_per_s * speedup / scale,
            "max_batch": spec.max_batch,
            "max_output_tokens": 0,
        }
        if args.hotspot_rate is None:
            args.hotspot_rate = float(args.engines_quality)
        if args.hotspot_requests is None:
            args.hotspot_requests = HOTSPOT_REQUESTS_PER_ENGINE * args.engines_quality
    else:
        defaults = dict(TRACE_DEFAULTS)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, type(TRACE_DEFAULTS[name])(value))


def hotspot_trace(requests: int, rate: float, output_scale: int) -> list[TraceRequest]:
    """The simulator's hotspot records (``kvrouter simulate --hotspot``, seed 7), with every
    output divided by ``output_scale`` (rounded up)."""
    chat = SyntheticSpec(requests=requests, rate_per_s=rate)
    trace = list(hotspot(HotspotSpec(chat=chat)))
    if output_scale <= 1:
        return trace
    out = []
    for r in trace:
        tokens = math.ceil(r.output_tokens / output_scale)
        body = dict(r.request_body(), max_tokens=tokens)
        out.append(dataclasses.replace(r, body=body, output_tokens=tokens))
    return out


def trace_reuse(trace: Sequence[TraceRequest]) -> float:
    """Share of prompt tokens an infinite cache would serve: leading blocks seen before."""
    seen: set[int] = set()
    hit = total = 0
    for r in trace:
        total += r.prompt_tokens
        lead = 0
        for k in r.engine_keys:
            if k not in seen:
                break
            lead += 1
        hit += lead * r.engine_block_tokens
        seen.update(r.engine_keys)
    return hit / total if total else 0.0


def write_kv_aware_policy(dest: Path, engine_capacity_tokens: int) -> None:
    """The kv-aware preset, told the engines' cache size (as an operator would set it)."""
    settings = {"index.engine_capacity_tokens": engine_capacity_tokens}
    dest.write_text(preset_text("kv-aware", settings))


@dataclass
class Replay:
    """What the client saw of one router's run."""

    ttfts: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0

    def fail(self, why: str) -> None:
        self.failures += 1
        self.errors[why] = self.errors.get(why, 0) + 1


def replay_body(req: TraceRequest, max_output: int) -> bytes:
    body = dict(req.request_body())
    out = int(body.get("max_tokens") or 1)
    body.update(
        model=MODEL,
        max_tokens=max(1, min(out, max_output) if max_output else out),
        stream=True,
        stream_options={"include_usage": True},
    )
    return orjson.dumps(body)


async def _send(
    http: aiohttp.ClientSession, url: str, req: TraceRequest, max_output: int, out: Replay
) -> None:
    data = replay_body(req, max_output)
    path = CHAT_COMPLETIONS if "messages" in req.request_body() else COMPLETIONS
    try:
        got = await read_stream(http, url + path, data)
    except (TimeoutError, aiohttp.ClientError) as e:
        out.fail(type(e).__name__)
        return
    if got.status != 200:
        out.fail(f"HTTP {got.status}")
        return
    if not got.done or got.first is None:
        out.fail("stream cut short")
        return
    prompt, cached = got.usage or (0, 0)
    out.prompt_tokens += prompt
    out.cached_tokens += cached
    out.ttfts.append(got.first)


async def replay(
    urls: Sequence[str], trace: Sequence[TraceRequest], speedup: float, max_output: int
) -> Replay:
    """Send every request at its trace time / ``speedup`` (open loop) and wait for all;
    request i to ``urls[i % len(urls)]``, as a Service spreads them over replicas."""
    out = Replay()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    t_first = trace[0].timestamp
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tasks = []
        start = time.perf_counter()
        for i, req in enumerate(trace):
            due = start + (req.timestamp - t_first) / speedup
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # How late the client is sending: the offered load is only the trace's while small.
            out.lags.append(max(0.0, time.perf_counter() - due))
            url = urls[i % len(urls)]
            tasks.append(asyncio.create_task(_send(http, url, req, max_output, out)))
        await asyncio.gather(*tasks)
        out.seconds = time.perf_counter() - start
    return out


async def _engine_stats(http: aiohttp.ClientSession, engines: Sequence[Proc]) -> list[Any]:
    stats = []
    for e in engines:
        async with http.get(e.url + "/stats") as r:
            r.raise_for_status()
            stats.append(await r.json())
    return stats


async def reset_engines(engines: Sequence[Proc]) -> None:
    async with aiohttp.ClientSession() as http:
        for e in engines:
            async with http.post(e.url + "/reset") as r:
                r.raise_for_status()
        for s in await _engine_stats(http, engines):
            if s["requests"] or s["cache_tokens"] or s["running"] or s["waiting"]:
                raise RuntimeError(f"an engine is not idle and empty after /reset: {s}")


async def engine_stats(engines: Sequence[Proc]) -> list[Any]:
    async with aiohttp.ClientSession() as http:
        return await _engine_stats(http, engines)


@dataclass
class QualityRow:
    router: str
    replay: Replay
    stats: list[Any]
    cpu_seconds: float

    @property
    def requests(self) -> int:
        return len(self.replay.ttfts)

    @property
    def hit_ratio(self) -> float:
        prompt = sum(s["prompt_tokens"] for s in self.stats)
        return sum(s["cached_tokens"] for s in self.stats) / prompt if prompt else 0.0

    @property
    def share(self) -> tuple[float, list[int]]:
        counts = [int(s["requests"]) for s in self.stats]
        mean = sum(counts) / len(counts)
        return (max(counts) / mean if mean else 0.0), counts

    def busy_share(self, prefill_tokens_per_s: float, decode_tokens_per_s: float) -> float:
        """Busiest engine's busy time over the mean (the simulator's load imbalance)."""
        busy = [
            (s["prompt_tokens"] - s["cached_tokens"]) / prefill_tokens_per_s
            + s["completion_tokens"] / decode_tokens_per_s
            for s in self.stats
        ]
        mean = sum(busy) / len(busy)
        return max(busy) / mean if mean else 0.0


def run_quality(args: argparse.Namespace, tmp: Path) -> str:
    resolve_quality(args)
    if args.hotspot:
        trace = hotspot_trace(args.hotspot_requests, args.hotspot_rate, args.output_scale)
    else:
        trace = load_trace(args.trace, args.limit)
    if not trace:
        raise SystemExit(f"no records in {args.trace}")
    policy_capacity = args.kv_capacity_tokens
    policy_file = tmp / "kv-aware.yaml"
    write_kv_aware_policy(policy_file, policy_capacity)
    config = None
    if args.scrape_interval:
        # The engines' /metrics scraped on the compressed clock, as a real fleet at this
        # interval would be on its own.
        config = tmp / "kvrouter.yaml"
        config.write_text(
            f"engine_metrics: {{interval_seconds: {args.scrape_interval}, "
            f"timeout_seconds: {min(0.25, args.scrape_interval / 2)}}}\n"
        )
    engine_flags = [
        "--kv-capacity-tokens", str(args.kv_capacity_tokens),
        "--prefill-tokens-per-s", str(args.prefill_tokens_per_s),
        "--decode-tokens-per-s", str(args.decode_tokens_per_s),
        "--max-batch", str(args.max_batch),
    ]  # fmt: skip
    span = (trace[-1].timestamp - trace[0].timestamp) / args.speedup
    rows: list[QualityRow] = []
    with running([]) as procs:
        engines = start_engines(args.engines_quality, engine_flags, tmp, procs)
        for name in args.routers:
            asyncio.run(reset_engines(engines))
            own_policy = policy_file if name in ("kvrouter kv-aware", BASELINE) else None
            routers = start_routers(
                name, engines, tmp, own_policy, args.replicas, args.baseline, config
            )
            procs.extend(routers)
            print(f"quality: {name}, {len(trace)} requests over {span:.0f} s", flush=True)
            cpu0 = sum(tree_cpu_seconds(r.popen.pid) for r in routers)
            urls = [r.url for r in routers]
            rep = asyncio.run(replay(urls, trace, args.speedup, args.max_output_tokens))
            cpu = sum(tree_cpu_seconds(r.popen.pid) for r in routers) - cpu0
            stats = asyncio.run(engine_stats(engines))
            for r in routers:
                r.stop()
                procs.remove(r)
            label = f"{name} x{len(routers)}" if len(routers) > 1 else name
            rows.append(QualityRow(label, rep, stats, cpu))
    return quality_report(args, trace, policy_capacity, rows)


def quality_report(
    args: argparse.Namespace,
    trace: Sequence[TraceRequest],
    policy_capacity: int,
    rows: Sequence[QualityRow],
) -> str:
    offered = len(trace) / max(1e-9, (trace[-1].timestamp - trace[0].timestamp) / args.speedup)
    body = []
    for r in rows:
        share, counts = r.share
        rep = r.replay
        usage_hit = rep.cached_tokens / rep.prompt_tokens if rep.prompt_tokens else 0.0
        body.append(
            [
                r.router,
                f"{r.hit_ratio:.3f}",
                f"{usage_hit:.3f}",
                f"{percentile(rep.ttfts, 50) * 1000:.0f}",
                f"{percentile(rep.ttfts, 99) * 1000:.0f}",
                f"{r.requests / rep.seconds:.1f}" if rep.seconds else "-",
                f"{share:.2f} ({'/'.join(map(str, counts))})",
                f"{r.busy_share(args.prefill_tokens_per_s, args.decode_tokens_per_s):.2f}",
                f"{r.cpu_seconds * 1000 / max(1, r.requests):.2f}",
                str(rep.failures) + (f" {rep.errors}" if rep.errors else ""),
                f"{percentile(rep.lags, 99) * 1000:.0f}",
            ]
        )
    head = [
        "router",
        "hit ratio",
        "hit (usage)",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "req/s",
        "request share max/mean (per engine)",
        "busy time max/mean",
        "router CPU ms/req",
        "failures",
        "client lag p99 ms",
    ]
    outputs = f"at most {args.max_output_tokens}" if args.max_output_tokens else "the trace's"
    if args.hotspot:
        scale = max(1, args.output_scale)
        outputs = f"the generator's / {scale}" if scale > 1 else "the generator's"
        workload = (
            f"hotspot, {len(trace)} requests at {args.hotspot_rate:g} req/s (burst 120 to 240 s)"
        )
    else:
        workload = f"{args.trace.name}, first {len(trace)} requests"
    return (
        f"### Live routing quality: {workload}, "
        f"speedup {args.speedup:g} ({offered:.1f} req/s offered)\n\n"
        f"{args.engines_quality} engine-sims: KV cache {args.kv_capacity_tokens:,} tokens, "
        f"prefill {args.prefill_tokens_per_s:,.0f} tokens/s, decode "
        f"{args.decode_tokens_per_s:,.0f} tokens/s per sequence, max batch {args.max_batch}; "
        f"{outputs} output tokens; kv-aware engine_capacity_tokens {policy_capacity:,}. "
        f"Trace reuse with an infinite cache: {trace_reuse(trace):.3f}.\n\n"
        f"{table(head, body)}\n"
    )


# -- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = p.add_argument
    add("--overhead", action="store_true", help="run the overhead part")
    add("--quality", action="store_true", help="run the live routing-quality part")
    g = p.add_argument_group("overhead")
    g.add_argument("--engines", type=int, default=1, help="engine-sim --fast processes (1)")
    g.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    g.add_argument("--load-requests", type=int, default=2000, help="requests per load row")
    g.add_argument("--concurrency", type=int, nargs="+", default=[32, 256])
    g.add_argument("--prompt-chars", type=int, default=2000)
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="tokens/s per stream, each token its own chunk (0: engine-sim --fast, default)",
    )
    g.add_argument("--repeat", type=int, default=3, help="runs, fresh processes each (3)")
    g.add_argument(
        "--overhead-routers",
        nargs="+",
        choices=ROUTERS,
        default=list(OVERHEAD_DEFAULT),
        metavar="ROUTER",
        help=f"routers measured (default: {', '.join(OVERHEAD_DEFAULT)})",
    )
    g.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help=f"also measure kvrouter kv-aware from this source tree (e.g. an unpacked git "
        f"archive of an older commit), as {BASELINE!r}",
    )
    q = p.add_argument_group("quality")
    q.add_argument("--trace", type=Path, default=Path("../shared/data/conversation_trace.jsonl"))
    q.add_argument("--limit", type=int, default=2000, help="replay the first N records")
    q.add_argument(
        "--speedup", type=float, help="divide arrival times by this (trace 6, hotspot 3)"
    )
    q.add_argument("--engines-quality", type=int, default=4)
    # Unset engine settings take the workload's defaults (resolve_quality). RESULTS.md counts
    # the trace runs in Mooncake words, two of engine-sim's tokens each: its 500,000-token
    # cache and 40,000 prefill tokens/s are the trace defaults' 1,000,000 and 80,000.
    q.add_argument("--kv-capacity-tokens", type=int, help="trace 1000000, hotspot 400000")
    q.add_argument(
        "--prefill-tokens-per-s", type=float, help="trace 80000, hotspot 10000 x speedup"
    )
    q.add_argument(
        "--decode-tokens-per-s", type=float, help="trace 100, hotspot 40 x speedup / output scale"
    )
    q.add_argument("--max-batch", type=int, help="trace 16, hotspot 32")
    q.add_argument(
        "--max-output-tokens", type=int, help="0: the records' own (trace 64, hotspot 0)"
    )
    q.add_argument(
        "--scrape-interval",
        type=float,
        metavar="SECONDS",
        help="kvrouter scrapes the engines' /metrics this often (default: its own 0.5 s, "
        "not compressed; 0.5 / speedup is the simulator's 0.5 s)",
    )
    q.add_argument("--hotspot", action="store_true", help="replay the simulator's hotspot workload")
    q.add_argument("--hotspot-requests", type=int, help="hotspot requests (375 per engine)")
    q.add_argument("--hotspot-rate", type=float, help="hotspot chat rate, req/s (1 per engine)")
    q.add_argument(
        "--output-scale",
        type=int,
        default=HOTSPOT_OUTPUT_SCALE,
        help="hotspot: outputs and decode rate divided by this (8)",
    )
    q.add_argument(
        "--routers",
        nargs="+",
        choices=(*ROUTERS, BASELINE),
        default=list(QUALITY_DEFAULT),
        metavar="ROUTER",
        help=f"routers measured ({BASELINE!r}: --baseline's code, given the same policy file "
        "as kvrouter kv-aware)",
    )
    q.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="each kvrouter as this many replicas gossiping on loopback, the client's "
        "requests spread over them in turn (1)",
    )
    args = p.parse_args(argv)
    if BASELINE in args.routers and args.baseline is None:
        p.error(f"{BASELINE!r} needs --baseline DIR")
    if not args.overhead and not args.quality:
        args.overhead = args.quality = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = set(args.routers if args.quality else ())
    wanted |= set(args.overhead_routers if args.overhead else ())
    needs = {"sglang_router": SGLANG_POLICIES, "smg": SMG_POLICIES}
    for module, policies in needs.items():
        if wanted & set(policies) and importlib.util.find_spec(module) is None:
            print(f"{module} is not installed: pip install -e '.[bench]'", file=sys.stderr)
            return 2
    reports: Mapping[str, Callable[[argparse.Namespace, Path], str]] = {
        "overhead": run_overhead,
        "quality": run_quality,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="kvrouter-bench-") as tmp, stopping_on_sigterm():
            for part, run in reports.items():
                if getattr(args, part):
                    print(run(args, Path(tmp)), flush=True)
    except KeyboardInterrupt:
        print("interrupted; every process this bench started is stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
