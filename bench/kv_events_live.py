"""KV events live: approximate against precise routing, with bypass traffic and a restart.

Runs of the same workload, each on fresh processes on loopback (free ports):

- ``approximate``: ``--engines`` timed ``engine-sim`` processes behind ``kvrouter serve``
  (kv-aware, told the engines' cache size) without KV events: the router's index is what it
  routed, aged by its own eviction model;
- ``precise``: the same, with ``--kv-events`` for every engine: the index is what the engines
  say they store and evict (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``);
- ``precise-local``: ``precise`` with the router's own tokenizer (``--tokenizer``): token ids
  without a ``/tokenize`` round trip;
- ``pooled``: one engine-sim with the whole fleet's cache, prefill compute and slots taking
  all the traffic (``EngineSpec.pooled``): what a perfect router could not beat.

The workload is the first ``--requests`` records of a Mooncake trace (``router.core.workload``
expands each record's blocks to text), replayed in order, closed loop (``--concurrency`` in
flight), streamed completions with usage. A seeded ``--bypass-share`` of the requests goes
straight to the engines, round-robin, as clients that skip the router would; the rest goes
through the router. When request ``--restart-at`` x requests is due, engine
``--restart-engine`` is restarted: ``POST /reset`` empties its cache (and counters, which are
read just before) and publishes ``AllBlocksCleared``. The pooled engine is not reset (there is
no quarter of one engine to clear), so the restart's cost is part of the fleet's gap to it.

The hit ratio is the engines': cached over prompt tokens from ``GET /stats`` over all traffic,
routed and bypass (the restarted engine's counters before the reset added in). The split
between routed and bypass requests comes from each response's
``usage.prompt_tokens_details.cached_tokens``. TTFT is the client's, to the first streamed
event, of routed requests. Every wait and the whole replay are bounded.

    python -m bench.kv_events_live [--trace ../shared/data/conversation_trace.jsonl]
        [--requests 3000] [--concurrency 16] [--engines 4] [--kv-capacity-tokens 800000]
        [--bypass-share 0.2] [--restart-at 0.5] [--restart-engine 0] [--seed 1]
        [--max-tokens 16] [--tokenize-timeout 0.5] [--run-timeout 900]
        [--tokenizer PATH|words] [--runs approximate precise precise-local pooled] [--json]

``--tokenizer`` gives every engine-sim of every run a model's tokenizer, so prompts count in
its ids, and adds ``precise-local``. ``words`` makes one here with an id per word of the run's
own prompts (``bench.common.write_word_tokenizer``; a Mooncake word is 8 characters,
so a prompt counts half the tokens it does without a tokenizer): a lookup per word, so that
four engines and the router tokenizing every prompt do not swamp a small machine. The table's
``/tokenize`` column counts the round trips the engines answered.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import (
    markdown_table,
    print_report,
    read_stream,
    stopping_on_sigterm,
    write_word_tokenizer,
)
from router.commands.fleet import Proc, http_json, metric, running, start_ready, wait_until
from router.core.stats import percentile
from router.core.workload import from_mooncake
from router.hostport import LOOPBACK, free_ports
from router.presets import preset_text

MODEL = "sim-model"
COMPLETIONS = "/v1/completions"
# Engines fast enough for a run of about a minute on a small machine, with prefill still
# costing more than decode, as on a real GPU (the values of bench.replicas_hit_ratio).
PREFILL_TOKENS_PER_S = 400_000
DECODE_TOKENS_PER_S = 1_000
MAX_BATCH = 16
REQUEST_TIMEOUT_SECONDS = 120.0
RUNS = ("approximate", "precise", "precise-local", "pooled")


@dataclass(frozen=True)
class Planned:
    """One request of the workload: its body and, when it bypasses the router, its engine."""

    body: bytes
    bypass_to: int | None


@dataclass
class Side:
    """What the client saw of one kind of traffic (routed or bypass)."""

    ttfts: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failed: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class Result:
    run: str
    routed: Side
    bypass: Side
    prompt_tokens: int  # the engines' own counters, over all traffic
    cached_tokens: int
    requests_per_engine: list[int]
    seconds: float
    tokenize_calls: int = 0  # POST /tokenize the engines answered
    router_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def busiest_share(self) -> float:
        counts = self.requests_per_engine
        mean = sum(counts) / len(counts) if counts else 0.0
        return max(counts) / mean if mean else 0.0


def plan(
    path: Path, n: int, max_tokens: int, share: float, engines: int, seed: int
) -> list[Planned]:
    """The first ``n`` records as streamed completions; a seeded ``share`` bypasses the router."""
    rng = random.Random(seed)
    bypassed = itertools.count()
    out: list[Planned] = []
    with path.open() as f:
        for i, line in enumerate(itertools.islice(f, n)):
            body = dict(from_mooncake(json.loads(line), f"{path}:{i + 1}").request_body())
            body.update(
                model=MODEL,
                max_tokens=max(1, min(int(body["max_tokens"]), max_tokens)),
                stream=True,
                stream_options={"include_usage": True},
            )
            target = next(bypassed) % engines if rng.random() < share else None
            out.append(Planned(orjson.dumps(body), target))
    return out


async def send(http: aiohttp.ClientSession, url: str, body: bytes, side: Side) -> None:
    """One streamed request: its TTFT and its usage go to ``side``; a failure is counted."""
    try:
        got = await read_stream(http, url + COMPLETIONS, body)
    except (TimeoutError, aiohttp.ClientError):
        side.failed += 1
        return
    if not got.done or got.first is None:
        side.failed += 1
        return
    side.ttfts.append(got.first)
    prompt, cached = got.usage or (0, 0)
    side.prompt_tokens += prompt
    side.cached_tokens += cached


async def replay(
    work: Sequence[Planned],
    router_url: str,
    engine_urls: Sequence[str],
    concurrency: int,
    restart: tuple[int, str] | None,
) -> tuple[Side, Side, dict[str, Any]]:
    """Send the workload in order, ``concurrency`` at a time; restart (reset) one engine when
    request ``restart[0]`` is due. Returns routed and bypass sides and the reset engine's
    counters taken just before its reset (empty without a restart)."""
    routed, bypass = Side(), Side()
    before_reset: dict[str, Any] = {}
    indices = iter(range(len(work)))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def restart_engine(url: str) -> None:
            async with http.get(url + "/stats") as r:
                r.raise_for_status()
                before_reset.update(await r.json())
            async with http.post(url + "/reset") as r:
                r.raise_for_status()

        async def worker() -> None:
            for i in indices:
                if restart is not None and i == restart[0]:
                    await restart_engine(restart[1])
                p = work[i]
                if p.bypass_to is None:
                    await send(http, router_url, p.body, routed)
                else:
                    await send(http, engine_urls[p.bypass_to % len(engine_urls)], p.body, bypass)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return routed, bypass, before_reset


def engine_args(capacity: int, engines: int, events: bool, tokenizer: str | None) -> list[str]:
    """engine-sim flags for one engine of the fleet (``engines`` > 1 pools that many)."""
    args = [
        "engine-sim", "--model", MODEL,
        "--kv-capacity-tokens", str(capacity * engines),
        "--prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S * engines),
        "--decode-tokens-per-s", str(DECODE_TOKENS_PER_S),
        "--max-batch", str(MAX_BATCH * engines),
    ]  # fmt: skip
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if events:
        port, replay_port = free_ports(2)
        args += ["--kv-events-port", str(port), "--kv-events-replay-port", str(replay_port)]
    return args


def event_endpoints(args: Sequence[str]) -> str:
    """``tcp://H:P,tcp://H:R`` from an engine-sim command line made by ``engine_args``."""
    port = args[list(args).index("--kv-events-port") + 1]
    replay_port = args[list(args).index("--kv-events-replay-port") + 1]
    return f"tcp://{LOOPBACK}:{port},tcp://{LOOPBACK}:{replay_port}"


ROUTER_SERIES = (
    "kvrouter_kv_events_total",
    "kvrouter_kv_event_gaps_total",
    "kvrouter_kv_events_degraded_backends",
    "kvrouter_tokenize_failures_total",
    "kvrouter_tokenize_seconds_count",
    "kvrouter_tokenize_seconds_sum",
    "kvrouter_retries_total",
)


def one_run(
    name: str, work: Sequence[Planned], args: argparse.Namespace, tmp: Path, policy: Path
) -> Result:
    pooled = name == "pooled"
    precise = name.startswith("precise")
    n_engines = 1 if pooled else args.engines
    restart_index = int(args.restart_at * len(work))
    with running([]) as procs:
        engines: list[Proc] = []
        events: list[str] = []
        for _ in range(n_engines):
            cmd = engine_args(
                args.kv_capacity_tokens, args.engines if pooled else 1, precise, args.tokenizer
            )
            # start_ready appends --port; the event ports are already in the command.
            engines.append(start_ready(cmd, tmp, timeout=60))
            procs.append(engines[-1])
            if precise:
                events.append(event_endpoints(cmd))
        router: Proc | None = None
        if not pooled:
            config = tmp / f"serve-{name}.yaml"
            kv: dict[str, object] = {"tokenize_timeout_seconds": args.tokenize_timeout}
            if name == "precise-local":
                kv["tokenizer"] = args.tokenizer
            config.write_text(json.dumps({"engines": {"kv_events": kv}}))
            serve = ["serve", "--config", str(config), "--host", LOOPBACK, "--policy", str(policy)]
            serve += ["--log-level", "warning"]
            for i, e in enumerate(engines):
                serve += ["--backend", e.url]
                if precise:
                    serve += ["--kv-events", f"{e.url}={events[i]}"]
            router = start_ready(serve, tmp, ready_path="/ready", timeout=60)
            procs.append(router)
            r = router
            wait_until(
                lambda: http_json(f"{r.url}/ready")["healthy_backends"] == n_engines,
                "every engine healthy",
                60,
            )
        urls = [e.url for e in engines]
        entry = router.url if router is not None else urls[0]
        restart = None if pooled else (restart_index, urls[args.restart_engine % n_engines])
        t0 = time.perf_counter()
        routed, bypass, before = asyncio.run(
            asyncio.wait_for(replay(work, entry, urls, args.concurrency, restart), args.run_timeout)
        )
        seconds = time.perf_counter() - t0
        stats = [http_json(f"{u}/stats") for u in urls]
        series = {s: metric(router, s) for s in ROUTER_SERIES} if router is not None else {}
        if router is not None and router.stop() != 0:
            raise RuntimeError(f"the router did not exit cleanly:\n{router.log()[-2000:]}")
    counts = [int(s["requests"]) for s in stats]
    prompt = sum(int(s["prompt_tokens"]) for s in stats) + int(before.get("prompt_tokens", 0))
    cached = sum(int(s["cached_tokens"]) for s in stats) + int(before.get("cached_tokens", 0))
    if before and not pooled:
        counts[args.restart_engine % n_engines] += int(before.get("requests", 0))
    calls = sum(int(s["tokenize_requests"]) for s in stats)
    calls += int(before.get("tokenize_requests", 0))
    return Result(name, routed, bypass, prompt, cached, counts, seconds, calls, series)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def table(results: Sequence[Result]) -> str:
    pooled = next((r.hit_ratio for r in results if r.run == "pooled"), 0.0)
    head = [
        "run", "hit ratio (engines)", "x pooled", "routed hit", "bypass hit",
        "TTFT p50 ms", "TTFT p99 ms", "tokenize ms (mean)", "/tokenize", "busiest/mean",
        "failed", "s",
    ]  # fmt: skip
    rows = [
        [
            r.run,
            f"{r.hit_ratio:.4f}",
            f"{r.hit_ratio / pooled:.3f}" if pooled else "-",
            f"{r.routed.hit_ratio:.4f}",
            f"{r.bypass.hit_ratio:.4f}",
            ms(percentile(r.routed.ttfts, 50)),
            ms(percentile(r.routed.ttfts, 99)),
            _tokenize_mean(r),
            str(r.tokenize_calls),
            f"{r.busiest_share:.2f}" if r.run != "pooled" else "-",
            str(r.routed.failed + r.bypass.failed),
            f"{r.seconds:.0f}",
        ]
        for r in results
    ]
    return markdown_table(head, rows)


def _tokenize_mean(r: Result) -> str:
    n = r.router_metrics.get("kvrouter_tokenize_seconds_count", 0.0)
    return f"{r.router_metrics['kvrouter_tokenize_seconds_sum'] / n * 1000:.1f}" if n else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/conversation_trace.jsonl")
    p.add_argument("--requests", type=int, default=3000, help="first N records of the trace")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument(
        "--kv-capacity-tokens", type=int, default=800_000, help="each engine's prefix cache"
    )
    p.add_argument("--bypass-share", type=float, default=0.2, help="share sent to engines")
    p.add_argument("--restart-at", type=float, default=0.5, help="share of the run, then reset")
    p.add_argument("--restart-engine", type=int, default=0, help="which engine is reset")
    p.add_argument("--seed", type=int, default=1, help="seed of the bypass choice")
    p.add_argument("--max-tokens", type=int, default=16, help="cap on each request's output")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds per replay, at most")
    p.add_argument(
        "--tokenize-timeout",
        type=float,
        default=0.5,
        help="the router's engines.kv_events.tokenize_timeout_seconds (0.5: its default)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH|words",
        help="the model's tokenizer for every engine, and for the precise-local router",
    )
    p.add_argument("--runs", nargs="+", choices=RUNS)
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = p.parse_args(argv)
    if not 0 <= args.bypass_share < 1 or not 0 <= args.restart_at <= 1:
        p.error("--bypass-share must be in [0, 1) and --restart-at in [0, 1]")
    if args.runs is None:
        args.runs = [r for r in RUNS if args.tokenizer or r != "precise-local"]
    if "precise-local" in args.runs and not args.tokenizer:
        p.error("the precise-local run needs --tokenizer")

    work = plan(
        Path(args.trace),
        args.requests,
        args.max_tokens,
        args.bypass_share,
        args.engines,
        args.seed,
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp, stopping_on_sigterm():
        tmp_path = Path(tmp)
        policy = tmp_path / "policy.yaml"
        settings = {"index.engine_capacity_tokens": args.kv_capacity_tokens}
        policy.write_text(preset_text("kv-aware", settings))
        if args.tokenizer == "words":
            prompts = (str(orjson.loads(w.body)["prompt"]) for w in work)
            args.tokenizer = str(write_word_tokenizer(tmp_path / "model", prompts))
        for name in args.runs:
            r = one_run(name, work, args, tmp_path, policy)
            print(
                f"{name}: hit ratio {r.hit_ratio:.4f}, "
                f"{r.routed.failed + r.bypass.failed} failed, {r.seconds:.0f} s, "
                f"router {r.router_metrics}",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)

    bypassed = sum(1 for w in work if w.bypass_to is not None)
    title = (
        f"{len(work)} requests of {Path(args.trace).name} ({bypassed} straight to the engines, "
        f"round-robin), {args.engines} engine-sims of {args.kv_capacity_tokens:,} tokens of "
        f"cache, engine {args.restart_engine} reset at request "
        f"{int(args.restart_at * len(work))}, concurrency {args.concurrency}, kv-aware, "
        f"tokenize timeout {args.tokenize_timeout} s"
        f"{', engines tokenize with ' + args.tokenizer if args.tokenizer else ''}"
    )
    records = [
        {
            "run": r.run,
            "hit_ratio": r.hit_ratio,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "routed_hit_ratio": r.routed.hit_ratio,
            "bypass_hit_ratio": r.bypass.hit_ratio,
            "ttft_p50_s": percentile(r.routed.ttfts, 50),
            "ttft_p99_s": percentile(r.routed.ttfts, 99),
            "requests_per_engine": r.requests_per_engine,
            "tokenize_calls": r.tokenize_calls,
            "failed": r.routed.failed + r.bypass.failed,
            "seconds": r.seconds,
            "router_metrics": r.router_metrics,
        }
        for r in results
    ]
    print_report(title, table(results), records if args.json else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
