"""Prefill/decode disaggregation in simulation: goodput by link speed, four fleets side by side.

Simulation (the routing core and the engine model with interference, no processes). The same
number of engines in every fleet, the same requests at the same times (``router.core.
pd_simulator``): the aggregated kv-aware fleet, and P prefill + D decode engines routed by
kvrouter's decision, by always splitting (SGLang's gateway, Dynamo) and by llm-d's fixed
threshold (16 uncached tokens, its P/D guide's setting), at each link speed.

Workloads: the Mooncake conversation trace (a path argument), and a long-document workload
generated here (``documents``): questions about a corpus of 400 long documents (contracts,
manuals, code files: 6,000 to 24,000 tokens, Zipf-popular, twice what the fleet's caches hold),
most answered in a few tokens (extraction, yes/no, a clause number), a third at length
(summaries). Document QA and RAG over a fixed corpus look like this: a long shared prefix, a
short question, output lengths set by the task, and a long tail of documents asked about once
in a while, which some engine has to prefill again.

Objectives (``Objectives``): the first token within 2 s plus the prompt's own prefill on an idle
engine (0.1 ms a token at 10,000 tokens/s: a 100,000-token prompt is allowed 12 s), and every
later token within 50 ms, twice an unloaded engine's 25 ms. Goodput: requests per second
meeting both.

The P:D split is sized the way an operator sizes pools from the aggregated fleet's own
metrics: prefill demand (the prompt tokens it prefilled per second over one engine's prefill
rate) against decode demand (sequences decoding at once over one engine's batch slots), the
engines shared in that proportion, at least one of each.

Goals checked per link: kvrouter >= 1.5x aggregated at 400 Gbps, >= aggregated at every link,
>= always-split and >= threshold at every link. ``--sweep`` adds goodput against load at
400 Gbps (aggregated and kvrouter, the pools sized again at each load).

    python -m bench.pd_goodput ../shared/data/conversation_trace.jsonl [--engines 8]
        [--speedup 1.25] [--doc-rate 12] [--links 10 25 100 400 7200] [--sweep]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from router.commands.traces import read_trace
from router.core.disaggregation import DisaggSettings
from router.core.engine_model import EngineSpec
from router.core.pd_simulator import Objectives, PdFleet, PdResult, simulate_fleet
from router.core.workload import TraceRequest, from_body
from router.presets import preset_path
from router.yaml_files import load_policy

LINKS = (10.0, 25.0, 100.0, 400.0, 7200.0)  # 7,200 Gbps: NVLink's 900 GB/s
SPLITTERS = ("kvrouter", "always-split", "threshold")


def documents(
    requests: int, rate_per_s: float, seed: int = 11, corpus: int = 400
) -> list[TraceRequest]:
    """Questions about long shared documents, arriving at ``rate_per_s`` (seeded)."""
    rng = random.Random(seed)
    vocabulary = [f"w{i:x}" for i in range(4096)]

    def words(n: int) -> str:
        return " ".join(rng.choices(vocabulary, k=n))

    # About 1.6 tokens a word (four characters a token); 6,000 to 24,000 tokens each.
    docs = [f"document {d}: {words(rng.randint(3_700, 15_000))}" for d in range(corpus)]
    weights = [1.0 / (d + 1) ** 0.9 for d in range(corpus)]
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rate_per_s)
        doc = rng.choices(range(corpus), weights)[0]
        short = rng.random() < 2 / 3
        answer = rng.randint(4, 40) if short else rng.randint(300, 900)
        body = {
            "model": "documents",
            "messages": [
                {"role": "system", "content": docs[doc]},
                {"role": "user", "content": f"question: {words(rng.randint(10, 60))}"},
            ],
            "max_tokens": answer,
            "timestamp": t,
        }
        out.append(from_body(body, f"documents[{i}]"))
    return out


def pools(
    trace: Sequence[TraceRequest], spec: EngineSpec, engines: int, hit: float, speedup: float
) -> tuple[int, int, float, float]:
    """(prefill, decode) engines in proportion to the aggregated fleet's two demands."""
    span = max(1e-9, (trace[-1].timestamp - trace[0].timestamp) / speedup)
    prompt = sum(r.prompt_tokens for r in trace)
    prefill = (1.0 - hit) * prompt / spec.prefill_tokens_per_s / span
    decoding = sum(spec.decode_seconds(r.output_tokens) for r in trace) / span / spec.max_batch
    p = round(engines * prefill / (prefill + decoding))
    p = min(engines - 1, max(1, p))
    return p, engines - p, prefill, decoding


def _row(r: PdResult) -> str:
    return (
        f"| {r.fleet} | {r.goodput:.3f} | {r.slo_attainment:.3f} | {r.hit_ratio:.3f} | "
        f"{r.ttft_p50:.2f} s | {r.ttft_p99:.2f} s | {r.tpot_p50 * 1000:.0f} ms | "
        f"{r.tpot_p99 * 1000:.0f} ms | {r.split_share:.2f} |"
    )


def run(
    label: str, trace: Sequence[TraceRequest], args: argparse.Namespace, speedup: float
) -> None:
    policy = load_policy(preset_path("kv-aware"))
    spec = EngineSpec(decode_stall=1.0)
    goal = Objectives(2.0, 0.05, 1.0 / spec.prefill_tokens_per_s)
    t0 = time.perf_counter()
    base = PdFleet(1, max(1, args.engines - 1), spec, speedup=speedup)
    agg = simulate_fleet("aggregated", policy, trace, base, goal)
    p, d, need_p, need_d = pools(trace, spec, args.engines, agg.hit_ratio, speedup)
    print(f"\n#### {label}: {len(trace)} requests, {args.engines} engines\n")
    print(
        f"Pools sized from the aggregated fleet: prefill demand {need_p:.2f} engines, decode "
        f"demand {need_d:.2f} engines' slots -> {p} prefill + {d} decode.\n"
    )
    head = "| link | aggregated | kvrouter | always-split | threshold | kvrouter / aggregated |"
    print(head)
    print("|---|---|---|---|---|---|")
    detail: list[tuple[float, list[PdResult]]] = []
    for gbps in args.links:
        fleet = PdFleet(p, d, spec, DisaggSettings(link_gbps=gbps), speedup=speedup)
        rows = [simulate_fleet(n, policy, trace, fleet, goal) for n in SPLITTERS]
        detail.append((gbps, rows))
        by = {r.fleet: r for r in rows}
        kv = by["kvrouter"]
        ratio = kv.goodput / agg.goodput if agg.goodput else float("inf")
        ok = [
            kv.goodput >= agg.goodput,
            kv.goodput >= by["always-split"].goodput,
            kv.goodput >= by["threshold"].goodput,
        ]
        if gbps == 400:
            ok.append(ratio >= 1.5)
        mark = "" if all(ok) else " (goal missed)"
        cells = " | ".join(f"{by[n].goodput:.3f}" for n in SPLITTERS)
        print(f"| {gbps:g} Gbps | {agg.goodput:.3f} | {cells} | {ratio:.2f}x{mark} |")
    print(
        "\n| fleet | goodput (req/s) | attainment | hit ratio | TTFT p50 | TTFT p99 | "
        "TPOT p50 | TPOT p99 | split |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(_row(agg))
    for gbps, rows in detail:
        for r in rows:
            print(_row(r).replace(f"| {r.fleet} |", f"| {r.fleet}, {gbps:g} Gbps |", 1))
    print("\nkvrouter's paths per link:")
    for gbps, rows in detail:
        print(f"- {gbps:g} Gbps: {rows[0].paths}")
    print(f"\n({time.perf_counter() - t0:.0f} s)", flush=True)


def sweep(
    label: str, traces: Sequence[tuple[float, Sequence[TraceRequest], float]], engines: int
) -> None:
    """Aggregated against kvrouter at 400 Gbps as the load grows, pools sized per load."""
    policy = load_policy(preset_path("kv-aware"))
    spec = EngineSpec(decode_stall=1.0)
    goal = Objectives(2.0, 0.05, 1.0 / spec.prefill_tokens_per_s)
    print(f"\n#### {label}: load against goodput at 400 Gbps\n")
    print("| load | pools | aggregated | kvrouter | kvrouter / aggregated |")
    print("|---|---|---|---|---|")
    for load, trace, speedup in traces:
        base = PdFleet(1, max(1, engines - 1), spec, speedup=speedup)
        agg = simulate_fleet("aggregated", policy, trace, base, goal)
        p, d, _, _ = pools(trace, spec, engines, agg.hit_ratio, speedup)
        fleet = PdFleet(p, d, spec, DisaggSettings(link_gbps=400.0), speedup=speedup)
        kv = simulate_fleet("kvrouter", policy, trace, fleet, goal)
        ratio = kv.goodput / agg.goodput if agg.goodput else float("inf")
        print(
            f"| {load:g} | {p}P + {d}D | {agg.goodput:.3f} ({agg.slo_attainment:.2f}) | "
            f"{kv.goodput:.3f} ({kv.slo_attainment:.2f}) | {ratio:.2f}x |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace", help="the Mooncake conversation trace (JSONL)")
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--speedup", type=float, default=1.25, help="the Mooncake trace's (1.25)")
    ap.add_argument("--limit", type=int, help="replay only the first N Mooncake requests")
    ap.add_argument("--doc-requests", type=int, default=3000)
    ap.add_argument("--doc-rate", type=float, default=12.0, help="documents: requests/s (12)")
    ap.add_argument("--links", type=float, nargs="+", default=list(LINKS))
    ap.add_argument("--sweep", action="store_true", help="also goodput against load, 400 Gbps")
    args = ap.parse_args()
    trace = read_trace(args.trace, args.limit)
    run(f"Mooncake conversation trace at {args.speedup:g}x", trace, args, args.speedup)
    docs = documents(args.doc_requests, args.doc_rate)
    run(f"Long documents at {args.doc_rate:g} requests/s", docs, args, 1.0)
    if args.sweep:
        speeds = [(x, trace, x) for x in (1.0, 1.25, 1.5)]
        sweep("Mooncake conversation trace (load: speed-up)", speeds, args.engines)
        rates = [(x, documents(args.doc_requests, x), 1.0) for x in (8.0, 10.0, 12.0, 14.0)]
        sweep("Long documents (load: requests/s)", rates, args.engines)


if __name__ == "__main__":
    main()
