"""Every preset on both Mooncake traces, 8 and 32 engines, a tight and a roomy cache.

Prints one markdown table per setting (the rows of bench/RESULTS.md) and, per setting, whether
kv-aware meets the routing-quality goals: hit ratio >= 0.9 x pooled, load imbalance <= 1.25,
TTFT p99 below least-load's and round-robin's.

    python -m bench.simulate_presets [--data DIR] [--engines 8 32] [--capacity 200000 2000000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from router.commands.traces import read_trace
from router.core.engine_model import EngineSpec
from router.core.simulator import Fleet, SimResult, simulate
from router.presets import NAMES, preset_path
from router.yaml_files import load_policy

TRACES = ("conversation_trace.jsonl", "synthetic_trace.jsonl")
HEADER = "| policy | hit ratio | TTFT p50 | TTFT p99 | imbalance | decision p50 | p99 |"


def verdict(rows: list[SimResult]) -> str:
    by = {r.policy: r for r in rows}
    kv, pooled = by["kv-aware"], by["pooled-reference"]
    checks = {
        "hit>=0.9xpooled": kv.hit_ratio >= 0.9 * pooled.hit_ratio,
        "imbalance<=1.25": kv.load_imbalance <= 1.25,
        "p99<least-load": kv.ttft_p99 < by["least-load"].ttft_p99,
        "p99<round-robin": kv.ttft_p99 < by["round-robin"].ttft_p99,
    }
    ratio = kv.hit_ratio / pooled.hit_ratio if pooled.hit_ratio else 0.0
    marks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in checks.items())
    return f"kv-aware/pooled hit {ratio:.3f}; {marks}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--engines", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--capacity", type=int, nargs="+", default=[200_000, 2_000_000])
    args = ap.parse_args()
    policies = [load_policy(preset_path(n)) for n in NAMES]
    for trace_name in TRACES:
        trace = read_trace(Path(args.data) / trace_name)
        for engines in args.engines:
            for cap in args.capacity:
                t0 = time.perf_counter()
                fleet = Fleet(engines, EngineSpec(capacity_tokens=cap))
                rows = simulate(policies, trace, fleet, cpu_clock=time.thread_time_ns)
                took = time.perf_counter() - t0
                title = f"{trace_name}, {engines} engines, {cap:,} tokens each ({took:.0f} s)"
                print(f"\n#### {title}\n")
                print(HEADER)
                print("|---|---|---|---|---|---|---|")
                for r in rows:
                    print(
                        f"| {r.policy} | {r.hit_ratio:.3f} | {r.ttft_p50:.2f} s | "
                        f"{r.ttft_p99:.2f} s | {r.load_imbalance:.3f} | "
                        f"{r.decision_us_p50:.0f} us | {r.decision_us_p99:.0f} us |"
                    )
                print(f"\n{verdict(rows)}", flush=True)


if __name__ == "__main__":
    main()
