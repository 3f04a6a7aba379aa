"""What the gateway costs: added time-to-first-token, router CPU per request, throughput.

Starts ``kvrouter engine-sim --fast`` (no model delays, so what is measured is plumbing) and
``kvrouter serve`` in front of it, on loopback, then:

1. latency: one streamed chat request at a time, alternating direct-to-engine and through the
   router on keep-alive connections; TTFT is the time from sending the request to the first
   ``data:`` bytes. Reports p50 and p99 of each and the router's added p50 / p99.
2. load: at each concurrency, a fixed number of streamed requests through the router; reports
   throughput and the router's CPU time per request (utime + stime from /proc/<pid>/stat
   before and after, summed over the router process and its children, so that with
   ``--workers N`` every worker counts; Linux only). With several ``--route`` (chat,
   chat-usage, responses, messages: the same request in each API's shape; chat-usage asks for
   the usage event that Responses and Messages streams always carry), each concurrency runs every
   route ``--rounds`` times, in turns and in a rotated order, and reports each route's CPU
   per request beside the first route's.

The client, the router and the engine share this machine's cores, so absolute numbers move
with the machine; compare rows of one run.

With ``--tracing RATIO ...``, the cost of traces instead: one router with tracing off and one
per sampling ratio (``tracing.sample_ratio``), all in front of the same engine and exporting
over OTLP/gRPC to a collector in this process (tests.otlp, keeping nothing), loaded in turn
for ``--rounds`` rounds with their order rotated each round; reports each router's CPU per
request in every round and its median ratio to the untraced router's in the same rounds.
``--baseline DIR`` adds a router run from another source tree (an unpacked ``git archive``
of a commit before tracing existed), to see what tracing costs when off; with
``--baseline-ratio R`` that router traces at R too, to compare two trees' tracing.

    python -m bench.proxy_overhead [--requests 300] [--load-requests 2000]
                                   [--concurrency 32 256] [--prompt-chars 2000]
                                   [--workers N] [--route chat-usage responses messages]
                                   [--tracing 1.0 0.01 [--rounds 5]
                                    [--baseline DIR [--baseline-ratio R]]]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import ROUTES, chat_body, closed_loop, interleaved, tree_cpu_seconds
from router.commands.fleet import Proc, running, start_ready
from router.core.stats import percentile
from router.hostport import LOOPBACK
from tests.otlp import Collector

# With several workers, /ready answers 200 this many times in a row on fresh connections
# (each reaches a worker the kernel picks) before anything is measured.
READY_IN_A_ROW = 50


async def latency(
    engine: str, router: str, n: int, prompt_chars: int, max_tokens: int
) -> dict[str, float]:
    timings = await interleaved(
        {"direct": lambda _i: engine, "router": lambda _i: router},
        n,
        lambda i: chat_body(i, prompt_chars, max_tokens),
    )
    direct = [t.ttft for t in timings["direct"]]
    routed = [t.ttft for t in timings["router"]]
    return {
        "direct_p50": percentile(direct, 50),
        "direct_p99": percentile(direct, 99),
        "router_p50": percentile(routed, 50),
        "router_p99": percentile(routed, 99),
    }


async def load(
    router: str,
    pid: int,
    total: int,
    concurrency: int,
    prompt_chars: int,
    max_tokens: int,
    route: str = "chat",
) -> dict[str, float]:
    path, body = ROUTES[route]
    r = await closed_loop(
        lambda _i: router,
        total,
        concurrency,
        lambda i: body(i, prompt_chars, max_tokens),
        lambda: tree_cpu_seconds(pid),
        path,
    )
    return {
        "requests": r.requests,
        "seconds": r.seconds,
        "cpu_seconds": r.cpu_seconds or 0.0,
        "cpu_ms_per_request": r.cpu_ms_per_request or 0.0,
        "failures": r.failures,
    }


def by_route(router: Proc, args: argparse.Namespace, concurrency: int) -> dict[str, dict[str, Any]]:
    """Each route's totals over ``args.rounds`` rounds at ``concurrency`` (and its CPU ms per
    request in each round), the routes taking turns, the order rotated each round, so drift
    in the machine's load hits them alike."""
    totals: dict[str, dict[str, Any]] = {
        r: {"requests": 0.0, "seconds": 0.0, "cpu_seconds": 0.0, "failures": 0.0, "rounds": []}
        for r in args.route
    }
    for n in range(args.rounds):
        k = n % len(args.route)
        for route in args.route[k:] + args.route[:k]:
            got = asyncio.run(
                load(
                    router.url,
                    router.popen.pid,
                    args.load_requests,
                    concurrency,
                    args.prompt_chars,
                    args.max_tokens,
                    route,
                )
            )
            for key in ("requests", "seconds", "cpu_seconds", "failures"):
                totals[route][key] += got[key]
            totals[route]["rounds"].append(got["cpu_ms_per_request"])
    return totals


def wait_all_ready(url: str, attempts: int = 2000) -> None:
    """Until /ready answers 200 ``READY_IN_A_ROW`` times in a row (every worker is ready)."""
    in_a_row = 0
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as r:
                in_a_row = in_a_row + 1 if r.status == 200 else 0
        except OSError:
            in_a_row = 0
        if in_a_row >= READY_IN_A_ROW:
            return
    raise RuntimeError(f"{url}/ready: not ready on every worker")


# The --tracing rows: off, a ratio, or the --baseline tree's router.
Traced = float | None | Path


def traced_router(
    engine: Proc, ratio: Traced, collector: Collector, tmp: Path, baseline_ratio: float | None
) -> Proc:
    """A router in front of ``engine``, tracing at ``ratio`` into ``collector`` (None: off; a
    path: that tree's router, tracing at ``baseline_ratio`` or, without it, by its defaults)."""
    args = ["serve", "--host", LOOPBACK, "--backend", engine.url, "--log-level", "warning"]
    if isinstance(ratio, Path):
        env = {"PYTHONPATH": str(ratio)}
        if baseline_ratio is not None:
            config = tracing_config(tmp / "tracing-baseline.yaml", baseline_ratio, collector)
            args += ["--config", str(config)]
        return start_ready(args, tmp, ready_path="/ready", cwd=ratio, env=env)
    config = tracing_config(tmp / f"tracing-{ratio}.yaml", ratio, collector)
    return start_ready([*args, "--config", str(config)], tmp, ready_path="/ready")


def tracing_config(path: Path, ratio: float | None, collector: Collector) -> Path:
    tracing = "{enabled: false}"
    if ratio is not None:
        tracing = f"{{enabled: true, endpoint: '{collector.endpoint}', sample_ratio: {ratio}}}"
    path.write_text(f"tracing: {tracing}\n")
    return path


def tracing_cost(args: argparse.Namespace) -> int:
    """CPU per request with tracing off and at each ratio, side by side in rotated rounds."""
    ratios: list[Traced] = [None, *args.tracing, *([args.baseline] if args.baseline else [])]
    cpu: dict[Traced, list[float]] = {r: [] for r in ratios}
    concurrency = args.concurrency[0]
    with (
        tempfile.TemporaryDirectory() as tmp,
        Collector(keep=False) as collector,
        running([]) as procs,
    ):
        engine = start_ready(["engine-sim", "--fast"], Path(tmp))
        procs.append(engine)
        routers = {
            r: traced_router(engine, r, collector, Path(tmp), args.baseline_ratio) for r in ratios
        }
        procs.extend(routers.values())
        for n in range(args.rounds):
            for r in ratios[n % len(ratios) :] + ratios[: n % len(ratios)]:
                row = asyncio.run(
                    load(
                        routers[r].url,
                        routers[r].popen.pid,
                        args.load_requests,
                        concurrency,
                        args.prompt_chars,
                        args.max_tokens,
                    )
                )
                cpu[r].append(row["cpu_ms_per_request"])
        spans = collector.count
    print(
        f"Router CPU per request with tracing, {args.rounds} rounds of {args.load_requests} "
        f"streamed requests at concurrency {concurrency} per router ({spans} spans received)"
    )
    print(f"  {'tracing':<14} {'CPU ms/req per round':<40} {'median ratio to off':>20}")
    for r in ratios:
        if isinstance(r, Path):
            name = "baseline" if args.baseline_ratio is None else f"base {args.baseline_ratio:g}"
        else:
            name = "off" if r is None else f"ratio {r:g}"
        rounds = " ".join(f"{c:.3f}" for c in cpu[r])
        ratio = statistics.median(c / off for c, off in zip(cpu[r], cpu[None], strict=True))
        print(f"  {name:<14} {rounds:<40} {ratio:>20.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    p.add_argument("--load-requests", type=int, default=2000, help="requests per concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 256])
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--workers", type=int, default=1, help="kvrouter serve --workers N")
    p.add_argument("--tracing", type=float, nargs="+", help="sampling ratios to compare to off")
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="load runs per route and concurrency (1), or rounds of --tracing's (5)",
    )
    p.add_argument("--baseline", type=Path, help="with --tracing: also a router from this tree")
    p.add_argument(
        "--baseline-ratio", type=float, help="with --baseline: that router traces at this ratio"
    )
    p.add_argument("--route", nargs="+", choices=sorted(ROUTES), default=["chat"])
    args = p.parse_args(argv)
    if args.tracing:
        args.rounds = args.rounds or 5
        return tracing_cost(args)
    args.rounds = args.rounds or 1

    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        tmp_path = Path(tmp)
        engine = start_ready(["engine-sim", "--fast"], tmp_path)
        procs.append(engine)
        router: Proc = start_ready(
            [
                "serve",
                "--host",
                LOOPBACK,
                "--backend",
                engine.url,
                "--log-level",
                "warning",
                "--workers",
                str(args.workers),
            ],
            tmp_path,
            ready_path="/ready",
        )
        procs.append(router)
        wait_all_ready(router.url)
        lat = asyncio.run(
            latency(engine.url, router.url, args.requests, args.prompt_chars, args.max_tokens)
        )
        rows = [(c, by_route(router, args, c)) for c in args.concurrency]

    ms = 1000.0
    print(
        f"TTFT, one request at a time ({args.requests} each, engine-sim --fast, "
        f"{args.prompt_chars}-char prompt, {args.max_tokens} tokens, streamed)"
    )
    print(f"  {'path':<10} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'direct':<10} {lat['direct_p50'] * ms:8.3f} {lat['direct_p99'] * ms:8.3f}")
    print(f"  {'router':<10} {lat['router_p50'] * ms:8.3f} {lat['router_p99'] * ms:8.3f}")
    print(
        f"  {'added':<10} {(lat['router_p50'] - lat['direct_p50']) * ms:8.3f} "
        f"{(lat['router_p99'] - lat['direct_p99']) * ms:8.3f}"
    )
    print()
    print(
        f"Through the router ({args.workers} worker(s)), "
        f"{args.load_requests} streamed requests per row and round, {args.rounds} round(s)"
    )
    first = args.route[0]
    print(
        f"  {'concurrency':>11} {'route':>10} {'req/s':>9} {'router CPU ms/req':>18} "
        f"{'vs ' + first:>9}  per round (ms/req, then vs {first})"
    )
    for c, routes in rows:
        base = routes[first]["cpu_seconds"] / max(1.0, routes[first]["requests"])
        for route, r in routes.items():
            rps = r["requests"] / r["seconds"] if r["seconds"] else 0.0
            cpu = r["cpu_seconds"] / max(1.0, r["requests"])
            ratio = cpu / base if base else 0.0
            each = ", ".join(f"{x:.3f}" for x in r["rounds"])
            paired = ", ".join(
                f"{x / b:.2f}" if b else "-"
                for x, b in zip(r["rounds"], routes[first]["rounds"], strict=True)
            )
            print(
                f"  {c:>11} {route:>10} {rps:9.1f} {cpu * 1000:18.3f} {ratio:9.3f}  "
                f"{each}; {paired}  ({int(r['failures'])} failed)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
