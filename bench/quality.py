"""bench.sglang_compare --quality: each router's live routing quality on a replayed workload.

``--engines-quality`` engine-sims with a timing model (``--prefill-tokens-per-s``,
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
and failures. For kvrouter, a second table sets its routing-quality counters (read from its
/metrics at the end of the run, summed over replicas) beside the engines' /stats: achieved
(the cached tokens the engines' ``usage`` reported to the router) against the engines' own
``cached_tokens``, which should agree, and reachable, routed and the belief error, as
shares of the engines' prompt tokens. Busy time is the simulator's imbalance measure, from
the engines' counters: uncached prompt tokens / prefill rate + output tokens / decode rate.

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
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import markdown_table, read_stream, tree_cpu_seconds
from bench.peers import BASELINE, KVROUTER_POLICIES, MODEL, start_engines, start_routers
from router.commands.fleet import Proc, http_json, metric_in, metrics_text, running
from router.core.engine_model import EngineSpec
from router.core.stats import percentile
from router.core.workload import HotspotSpec, SyntheticSpec, TraceRequest, from_mooncake, hotspot
from router.presets import preset_text

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
# A replayed request that has not finished by then counts as failed (the engines are quick).
REQUEST_TIMEOUT_SECONDS = 300.0


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
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
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


def engine_stats(engines: Sequence[Proc]) -> list[Any]:
    """Every engine's GET /stats."""
    return [http_json(f"{e.url}/stats") for e in engines]


def reset_engines(engines: Sequence[Proc]) -> None:
    """Every engine's cache and counters emptied (POST /reset), and checked to be."""
    for e in engines:
        http_json(f"{e.url}/reset", {})
    for s in engine_stats(engines):
        if s["requests"] or s["cache_tokens"] or s["running"] or s["waiting"]:
            raise RuntimeError(f"an engine is not idle and empty after /reset: {s}")


# kvrouter's routing-quality counters (router.gateway.quality), summed over engines.
COUNTERS = {
    "reachable": "kvrouter_prefix_reachable_tokens_total",
    "routed": "kvrouter_prefix_routed_tokens_total",
    "achieved": "kvrouter_prefix_achieved_tokens_total",
    "over": "kvrouter_prefix_belief_error_tokens_total",
    "under": "kvrouter_prefix_belief_error_tokens_total",
}


def router_counters(routers: Sequence[Proc]) -> dict[str, float] | None:
    """The routing-quality counters of ``routers`` summed (None: they export none)."""
    texts = [metrics_text(r) for r in routers]
    if not all(COUNTERS["achieved"] in t for t in texts):
        return None
    out: dict[str, float] = {}
    for key, name in COUNTERS.items():
        labels = {"direction": key} if key in ("over", "under") else {}
        out[key] = sum(metric_in(t, name, **labels) for t in texts)
    return out


@dataclass
class QualityRow:
    router: str
    replay: Replay
    stats: list[Any]
    cpu_seconds: float
    counters: dict[str, float] | None = None

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
            reset_engines(engines)
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
            stats = engine_stats(engines)
            ours = name in KVROUTER_POLICIES or name == BASELINE
            counters = router_counters(routers) if ours else None
            for r in routers:
                r.stop()
                procs.remove(r)
            label = f"{name} x{len(routers)}" if len(routers) > 1 else name
            rows.append(QualityRow(label, rep, stats, cpu, counters))
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
        f"{_header(args, trace, policy_capacity, workload, outputs, offered)}"
        f"{markdown_table(head, body)}\n{counters_table(rows)}"
    )


def counters_table(rows: Sequence[QualityRow]) -> str:
    """kvrouter's routing-quality counters beside the engines' /stats ('' when none)."""
    body = []
    for r in rows:
        c = r.counters
        if c is None:
            continue
        prompt = sum(s["prompt_tokens"] for s in r.stats)
        cached = sum(s["cached_tokens"] for s in r.stats)
        shares = [
            f"{c[k] / prompt:.4f}" if prompt else "-"
            for k in ("reachable", "routed", "achieved", "over", "under")
        ]
        body.append(
            [
                r.router,
                f"{prompt:,}",
                f"{cached:,}",
                f"{c['achieved']:,.0f}",
                f"{c['achieved'] / cached:.4f}" if cached else "-",
                *shares,
            ]
        )
    if not body:
        return ""
    head = [
        "router",
        "/stats prompt tokens",
        "/stats cached",
        "achieved (router)",
        "achieved / cached",
        "reachable",
        "routed",
        "achieved",
        "belief over",
        "belief under",
    ]
    return (
        "\nkvrouter's routing-quality counters against the engines' /stats (the last five "
        "columns: shares of the engines' prompt tokens):\n\n"
        f"{markdown_table(head, body)}\n"
    )


def _header(
    args: argparse.Namespace,
    trace: Sequence[TraceRequest],
    policy_capacity: int,
    workload: str,
    outputs: str,
    offered: float,
) -> str:
    return (
        f"### Live routing quality: {workload}, "
        f"speedup {args.speedup:g} ({offered:.1f} req/s offered)\n\n"
        f"{args.engines_quality} engine-sims: KV cache {args.kv_capacity_tokens:,} tokens, "
        f"prefill {args.prefill_tokens_per_s:,.0f} tokens/s, decode "
        f"{args.decode_tokens_per_s:,.0f} tokens/s per sequence, max batch {args.max_batch}; "
        f"{outputs} output tokens; kv-aware engine_capacity_tokens {policy_capacity:,}. "
        f"Trace reuse with an infinite cache: {trace_reuse(trace):.3f}.\n\n"
    )
