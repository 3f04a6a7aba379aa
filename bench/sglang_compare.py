"""kvrouter against SGLang's routers (the `bench` extra): overhead and live quality.

The peers are SGLang's router (sglang-router) and SMG, SGLang's model gateway (smg); every
process runs on this machine on free loopback ports and is stopped at the end, also on Ctrl-C,
SIGTERM or an error. Two parts; with neither flag, both run:

- ``--overhead`` (bench.overhead): what each router adds to a streamed request, in TTFT and
  CPU, in front of ``engine-sim --fast``, one request at a time and under load;
- ``--quality`` (bench.quality): the engines' prefix-cache hit ratio, TTFT, throughput and
  balance behind each router, on a Mooncake trace or the simulator's hotspot workload replayed
  open loop against timed engine-sims.

bench.peers starts the routers and engines. This module is the command line.

    python -m bench.sglang_compare [--overhead] [--quality]
        [--engines 1] [--requests 300] [--load-requests 2000] [--concurrency 32 256]
        [--max-tokens 32] [--pace 0] [--repeat 3] [--overhead-routers ROUTER ...]
        [--baseline DIR] [--access-log]
        [--trace ../shared/data/conversation_trace.jsonl] [--limit 2000] [--speedup 6]
        [--engines-quality 4] [--kv-capacity-tokens 1000000] [--prefill-tokens-per-s 80000]
        [--decode-tokens-per-s 100] [--max-batch 16] [--max-output-tokens 64]
        [--hotspot [--hotspot-requests N] [--hotspot-rate R] [--output-scale 8]]
        [--routers ROUTER ...] [--replicas 1]

(Engine and replay defaults shown are the trace's; ``--hotspot`` has its own, in bench.quality.)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.common import stopping_on_sigterm
from bench.overhead import run_overhead
from bench.peers import BASELINE, ROUTERS, SGLANG_POLICIES, SMG_POLICIES
from bench.quality import HOTSPOT_OUTPUT_SCALE, run_quality

QUALITY_DEFAULT = ("kvrouter kv-aware", "kvrouter round-robin", "sglang cache_aware")
OVERHEAD_DEFAULT = ("kvrouter kv-aware", "sglang cache_aware", "smg cache_aware")


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
    g.add_argument(
        "--access-log",
        action="store_true",
        help="kvrouter routers but the baseline log at INFO, so that each writes its access "
        "log, a line per request, into its log file (default: all at WARNING, without)",
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
