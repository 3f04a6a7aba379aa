"""``kvrouter simulate``: replay a trace through the routing core and compare policies."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from router.commands import pd_options
from router.commands.traces import read_trace
from router.core.engine_model import EngineSpec
from router.core.pd_simulator import simulate_pd
from router.core.policy import Policy, PolicyError
from router.core.simulator import Fleet, Outside, Replicas, SimResult, simulate
from router.core.workload import (
    HotspotSpec,
    SyntheticSpec,
    TraceFormatError,
    TraceRequest,
    hotspot,
    synthetic,
)
from router.presets import DEFAULT, resolve
from router.yaml_files import load_policy

_SPEC = EngineSpec()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--trace", metavar="FILE", help="JSONL trace: Mooncake records or OpenAI bodies"
    )
    src.add_argument(
        "--synthetic",
        action="store_true",
        help="generate a multi-tenant, multi-turn chat workload instead of reading a trace",
    )
    src.add_argument(
        "--hotspot",
        action="store_true",
        help="the synthetic chat plus one viral document with long answers, asked about by "
        "20%% of requests and 45%% during a burst (HotspotSpec)",
    )
    # --workers is the released spelling, accepted as an alias.
    parser.add_argument(
        "--engines", "--workers", dest="engines", type=int, default=8, help="engines (8)"
    )
    parser.add_argument(
        "--capacity-tokens",
        type=int,
        default=_SPEC.capacity_tokens,
        help=f"KV cache per engine, in tokens ({_SPEC.capacity_tokens})",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="FILE",
        help=f"policy file or preset name; repeat to compare (default: {DEFAULT})",
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=_SPEC.prefill_tokens_per_s,
        help=f"prefill speed of one engine ({_SPEC.prefill_tokens_per_s:g})",
    )
    parser.add_argument(
        "--decode-tokens-per-s",
        type=float,
        default=_SPEC.decode_tokens_per_s,
        help=f"decode speed of one sequence ({_SPEC.decode_tokens_per_s:g})",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=_SPEC.max_batch,
        help=f"concurrent sequences per engine ({_SPEC.max_batch})",
    )
    parser.add_argument(
        "--speedup", type=float, default=1.0, help="divide arrival times by this (1)"
    )
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument(
        "--requests", type=int, default=4000, help="with --synthetic: how many (4000)"
    )
    parser.add_argument(
        "--seed", type=int, default=7, help="RNG seed of --synthetic and --bypass-share (7)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=SyntheticSpec().rate_per_s,
        help=f"with --synthetic or --hotspot: requests per second ({SyntheticSpec().rate_per_s:g})",
    )
    parser.add_argument(
        "--report-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="engines report running, waiting and KV use this often, as the gateway scrapes "
        "them (0.5; 0: no reports, the router sees only what it sent)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="router replicas taking the requests in turns, sharing what they learn (1)",
    )
    parser.add_argument(
        "--gossip-lag",
        type=float,
        default=Replicas().lag,
        metavar="SECONDS",
        help="with --replicas: how late a replica's deltas and load reports reach the others "
        f"({Replicas().lag:g})",
    )
    parser.add_argument(
        "--load-interval",
        type=float,
        default=Replicas().load_interval,
        metavar="SECONDS",
        help="with --replicas: seconds between a replica's load reports "
        f"({Replicas().load_interval:g}; 0: before every decision)",
    )
    parser.add_argument(
        "--bypass-share",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="send this share of the requests (seeded by --seed) straight to the engines, "
        "round-robin, as clients that skip the router would (0)",
    )
    parser.add_argument(
        "--restart-at",
        type=float,
        metavar="SHARE",
        help="restart engine 0 (its cache emptied) when this share of the trace is due",
    )
    parser.add_argument(
        "--index",
        nargs="+",
        choices=("approximate", "precise"),
        default=["approximate"],
        help="the router's index: approximate (what it routed) and/or precise (fed the "
        "engines' KV cache events); each policy is replayed once per index (approximate)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    pd_options.add_arguments(parser)


def _progress(name: str, done: int, total: int) -> None:
    width = 30
    filled = width * done // max(1, total)
    bar = "#" * filled + "." * (width - filled)
    end = "\n" if done >= total else ""
    print(f"\r{name:>24} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def format_table(results: Sequence[SimResult]) -> str:
    """The results as an aligned text table, one row per policy."""
    head = (
        "policy",
        "requests",
        "hit_ratio",
        "ttft_p50",
        "ttft_p99",
        "imbalance",
        "dec_us_p50",
        "dec_us_p99",
    )
    rows = [
        (
            r.policy,
            str(r.requests),
            f"{r.hit_ratio:.3f}",
            f"{r.ttft_p50:.3f}s",
            f"{r.ttft_p99:.3f}s",
            f"{r.load_imbalance:.3f}",
            f"{r.decision_us_p50:.1f}",
            f"{r.decision_us_p99:.1f}",
        )
        for r in results
    ]
    return aligned(head, rows)


def aligned(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows under ``head`` in columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in (head, *rows)
    ]
    return "\n".join(lines)


def _policies(specs: Sequence[str] | None) -> list[Policy]:
    return [load_policy(resolve(s)) for s in (specs or [DEFAULT])]


def run(args: argparse.Namespace) -> int:
    try:
        policies = _policies(args.policy)
        spec = EngineSpec(
            capacity_tokens=args.capacity_tokens,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            decode_tokens_per_s=args.decode_tokens_per_s,
            max_batch=args.max_batch,
        )
        if args.engines < 1 or args.speedup <= 0 or args.rate <= 0:
            raise ValueError("--engines must be at least 1, --speedup and --rate above 0")
        if args.report_interval < 0:
            raise ValueError("--report-interval must be 0 or more")
        outside = Outside(args.bypass_share, args.restart_at, args.seed)
        replicas = Replicas(args.replicas, args.gossip_lag, args.load_interval)
        pd = pd_options.fleet_of(args, spec) if pd_options.wanted(args) else None
        trace: list[TraceRequest]
        chat = SyntheticSpec(requests=args.requests, seed=args.seed, rate_per_s=args.rate)
        if args.synthetic:
            trace = list(synthetic(chat))
        elif args.hotspot:
            trace = list(hotspot(HotspotSpec(chat=chat)))
        else:
            trace = read_trace(args.trace, args.limit)
    except (PolicyError, TraceFormatError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not trace:
        print("error: the trace has no requests", file=sys.stderr)
        return 1
    progress = _progress if sys.stderr.isatty() else None
    if pd is not None:
        rows = simulate_pd(policies[0], trace, *pd, progress)
        print(pd_options.as_json(rows) if args.json else aligned(*pd_options.table(rows)))
        return 0
    fleet = Fleet(
        args.engines,
        spec,
        args.speedup,
        report_interval=args.report_interval,
        outside=outside,
        replicas=replicas,
    )
    results = simulate(policies, trace, fleet, progress, args.index, time.thread_time_ns)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(format_table(results))
    return 0
