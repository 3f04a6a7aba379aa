"""bench.sglang_compare --overhead: what each router adds to a request, in time and CPU.

``--engines`` ``engine-sim --fast`` processes (no model delays: what is measured
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
``--access-log`` starts the measured kvrouters at ``--log-level info``, their access log on
(one JSON line per request into the log file), and the baseline at its usual warning level:
against a tree from before the access log, the ratio is the cost of the receipts, the
routing-quality counters and the log together; against this tree itself, of the log alone.

The report opens with the summary over the runs: each router's CPU per request in every run
and kvrouter's ratio to each peer's in the same run, and the TTFT each router adds at
concurrency 1 (interleaved); then each run's tables.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    LoadResult,
    Timing,
    chat_body,
    closed_loop,
    interleaved,
    markdown_table,
    tree_cpu_seconds,
)
from bench.peers import BASELINE, KVROUTER_POLICIES, start_engines, start_router
from router.commands.fleet import Proc, running
from router.core.stats import percentile


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


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
                extra = ["--log-level", "info"] if args.access_log and name != BASELINE else []
                routers[name] = start_router(name, engines, tmp, None, args.baseline, extra=extra)
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
    return markdown_table(head, rows)


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
    cpu_table = markdown_table(head, rows)
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
    lat_table = markdown_table(["path", "added TTFT p50 ms", "added TTFT p99 ms"], lat_rows)
    return (
        f"Router CPU per streamed request, ms (one value per run, {args.load_requests} requests "
        f"each), and kvrouter's ratio to each peer in the same run:\n\n{cpu_table}\n\n"
        f"TTFT added at concurrency 1 (interleaved, {args.requests} requests per path; direct "
        f"TTFT p50 {direct_p50} ms), one value per run:\n\n{lat_table}\n"
    )


def overhead_report(args: argparse.Namespace, runs: Sequence[OverheadResult]) -> str:
    parts = [
        f"### Overhead: {args.engines} x {engine_label(args)}, streamed chat, "
        f"{args.prompt_chars}-char prompt, {args.max_tokens} tokens, {len(runs)} runs"
        f"{', kvrouter (not the baseline) at --log-level info' if args.access_log else ''}\n\n"
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
        load = markdown_table(
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
