"""Small caches: hot prefixes spread for load without evicting other tenants' prompts.

Simulation (the routing core and the engine model, no processes). Workloads where an engine's
cache is small against its traffic: the viral document (``HotspotSpec``: a document in 20% of
requests and 45% during a burst, over multi-tenant multi-turn chat) at two document sizes, and
the multi-tenant chat alone; 8 engines caching 25,600 tokens each (one copy of the larger
document fills about a quarter of one), and 4x that as the control where copies are cheap.

Policies: the shipped kv-aware; kv-aware as it was before copies were priced
(``hot_prefix.keep_younger_than_seconds: 0``); the blind least-load and round-robin; the pooled
engine (one engine with the whole fleet's cache and compute), the hit ratio to compare with.

Goals checked per setting: kv-aware's hit ratio >= 0.95x the pooled engine's, load imbalance
<= 1.2, TTFT p50 <= 0.8x both blind policies'.

    python -m bench.small_caches [--engines 8] [--capacity 25600 102400] [--requests 4000]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from router.core.engine_model import EngineSpec
from router.core.policy import Policy
from router.core.simulator import Fleet, SimResult, simulate
from router.core.workload import HotspotSpec, SyntheticSpec, TraceRequest, hotspot, synthetic
from router.presets import preset_path
from router.yaml_files import load_policy


def _unpriced(p: Policy) -> Policy:
    hot = dataclasses.replace(p.hot_prefix, keep_younger_than_seconds=0.0)
    return dataclasses.replace(p, name="kv-aware, copies unpriced", hot_prefix=hot)


def _checks(rows: list[SimResult]) -> str:
    by = {r.policy: r for r in rows}
    kv, pooled = by["kv-aware"], by["pooled-reference"]
    blind = min(by["least-load"].ttft_p50, by["round-robin"].ttft_p50)
    ok = {
        "hit>=0.95xpooled": kv.hit_ratio >= 0.95 * pooled.hit_ratio,
        "imbalance<=1.2": kv.load_imbalance <= 1.2,
        "p50<=0.8xblind": kv.ttft_p50 <= 0.8 * blind,
    }
    marks = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ok.items())
    return f"kv-aware/pooled hit {kv.hit_ratio / pooled.hit_ratio:.3f}; {marks}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--capacity", type=int, nargs="+", default=[25_600, 102_400])
    ap.add_argument("--requests", type=int, default=4000)
    args = ap.parse_args()
    shipped = load_policy(preset_path("kv-aware"))
    policies = [
        shipped,
        _unpriced(shipped),
        load_policy(preset_path("least-load")),
        load_policy(preset_path("round-robin")),
    ]
    chat = SyntheticSpec(requests=args.requests)
    workloads: list[tuple[str, list[TraceRequest]]] = [
        (f"viral document, {w} words", list(hotspot(HotspotSpec(chat=chat, document_words=w))))
        for w in (5000, 3800)
    ]
    workloads.append(("multi-tenant chat", list(synthetic(chat))))
    for title, trace in workloads:
        for cap in args.capacity:
            t0 = time.perf_counter()
            fleet = Fleet(args.engines, EngineSpec(capacity_tokens=cap), report_interval=0.5)
            rows = simulate(policies, trace, fleet)
            took = time.perf_counter() - t0
            pooled = rows[-1].hit_ratio
            print(f"\n#### {title}, {args.engines} engines, {cap:,} tokens each ({took:.0f} s)\n")
            print("| policy | hit ratio | / pooled | TTFT p50 | TTFT p99 | imbalance |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                print(
                    f"| {r.policy} | {r.hit_ratio:.3f} | {r.hit_ratio / pooled:.3f} | "
                    f"{r.ttft_p50 * 1000:.0f} ms | {r.ttft_p99 * 1000:.0f} ms | "
                    f"{r.load_imbalance:.3f} |"
                )
            print(f"\n{_checks(rows)}")


if __name__ == "__main__":
    main()
