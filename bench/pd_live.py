"""kvrouter against SMG in front of the same prefill and decode pools, SGLang's protocol.

``--prefill`` engine-sims with ``--role prefill`` and ``--decode`` with ``--role decode``, all
``--kind sglang`` (they speak SGLang's bootstrap protocol, the transfer delay simulated from
the bytes and ``--link-gbps``), and two routers, one at a time on the same engines, reset in
between (POST /reset):

- kvrouter kv-aware, the engines given with their roles and the prefill engines' bootstrap
  ports in its config, ``disaggregation: {protocol: sglang, ...}`` with the engines' link and
  KV bytes per token, so that it prices the transfer as the engines charge it;
- SMG (``smg.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL``,
  the ``bench`` extra), ``--smg-policy`` for both pools (default cache_aware, its best).

The workload is the simulator's hotspot (``router.core.workload.hotspot``: multi-tenant chat
with a long document in a share of the requests, a burst half-way), replayed open loop at its
arrival times divided by ``--speedup``, the engines that much faster, outputs divided by
``--output-scale`` and the decode rate with them (bench.quality's hotspot settings, scaled to
the fleet). Reported per router, at the client: TTFT p50 and p99, TPOT p50 (the stream's time
after its first token over the tokens after the first); from the engines' own /stats: the
prefix-cache hit ratio over every engine and per pool (a decode engine counts as cached what
it held before the transfer), the KV tokens moved to decode engines, and each pool's
requests; the router's CPU per request and failures. The goal line sets kvrouter's TTFT p99
against SMG's (0.8x or less) with its TPOT p50 and hit ratio no worse. ``--repeat N`` runs
each router N times, the order alternating, and pools the runs.

    python -m bench.pd_live [--prefill 2] [--decode 2] [--requests 600] [--rate 4]
        [--speedup 3] [--output-scale 8] [--link-gbps 100] [--kv-bytes-per-token B]
        [--routers kvrouter smg] [--smg-policy cache_aware] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import markdown_table, stopping_on_sigterm, tree_cpu_seconds
from bench.peers import SMG, start_engines, start_peer, start_router
from bench.quality import (
    HOTSPOT_OUTPUT_SCALE,
    engine_stats,
    hotspot_trace,
    replay_body,
    reset_engines,
    write_kv_aware_policy,
)
from router.commands.fleet import Proc, http_json, running
from router.core.disaggregation import DEFAULT_KV_BYTES_PER_TOKEN
from router.core.engine_model import EngineSpec
from router.core.stats import percentile
from router.core.workload import TraceRequest
from router.gateway.openai.sse import Decoder

CHAT = "/v1/chat/completions"
ROUTERS = ("kvrouter", "smg")
REQUEST_TIMEOUT_SECONDS = 300.0
HEAD = [
    "router",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "hit ratio",
    "hit prefill / decode",
    "KV moved, M tokens",
    "requests prefill / decode",
    "router CPU ms/req",
    "failures",
]


def hit_ratio(stats: Sequence[Any]) -> float:
    """The engines' cached prompt tokens over their prompt tokens (GET /stats)."""
    prompt = sum(s["prompt_tokens"] for s in stats)
    return sum(s["cached_tokens"] for s in stats) / prompt if prompt else 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = p.add_argument
    add("--prefill", type=int, default=2, help="prefill engine-sims (2)")
    add("--decode", type=int, default=2, help="decode engine-sims (2)")
    add("--requests", type=int, default=600, help="hotspot requests (600)")
    add("--rate", type=float, default=4.0, help="hotspot chat rate, req/s of trace time (4)")
    add("--speedup", type=float, default=3.0, help="trace time and engines compressed by (3)")
    add("--output-scale", type=int, default=HOTSPOT_OUTPUT_SCALE, help="outputs divided by (8)")
    add("--link-gbps", type=float, default=100.0, help="the engines' prefill-to-decode link")
    add("--kv-bytes-per-token", type=int, default=DEFAULT_KV_BYTES_PER_TOKEN)
    add("--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS))
    add("--smg-policy", default="cache_aware", help="SMG's --policy for both pools")
    add("--repeat", type=int, default=1, help="runs per router, alternating, pooled (1)")
    return p.parse_args(argv)


# --- the fleet -------------------------------------------------------------------------------


def engine_flags(args: argparse.Namespace, role: str) -> list[str]:
    """engine-sim flags of one pool: the simulator's engine, ``--speedup`` times faster."""
    spec = EngineSpec()
    scale = max(1, args.output_scale)
    return [
        "--role", role, "--kind", "sglang",
        "--link-gbps", str(args.link_gbps),
        "--kv-bytes-per-token", str(args.kv_bytes_per_token),
        "--kv-capacity-tokens", str(spec.capacity_tokens),
        "--prefill-tokens-per-s", str(spec.prefill_tokens_per_s * args.speedup),
        "--decode-tokens-per-s", str(spec.decode_tokens_per_s * args.speedup / scale),
        "--max-batch", str(spec.max_batch),
    ]  # fmt: skip


@dataclass(frozen=True)
class Fleet:
    prefill: list[Proc]
    decode: list[Proc]
    bootstrap_ports: dict[str, int | None]  # prefill engine URL -> its bootstrap port

    @property
    def engines(self) -> list[Proc]:
        return [*self.prefill, *self.decode]


def start_fleet(args: argparse.Namespace, tmp: Path, procs: list[Proc]) -> Fleet:
    prefill = start_engines(args.prefill, engine_flags(args, "prefill"), tmp, procs)
    decode = start_engines(args.decode, engine_flags(args, "decode"), tmp, procs)
    ports = {e.url: http_json(f"{e.url}/stats").get("bootstrap_port") for e in prefill}
    return Fleet(prefill, decode, ports)


def kvrouter_config(fleet: Fleet, args: argparse.Namespace) -> str:
    """The config giving kvrouter the pools with their roles and the engines' link."""
    static = [
        {"url": e.url, "role": "prefill", "kind": "sglang", "bootstrap_port": port}
        for e in fleet.prefill
        for port in [fleet.bootstrap_ports[e.url]]
    ]
    static += [{"url": e.url, "role": "decode", "kind": "sglang"} for e in fleet.decode]
    section = {
        "protocol": "sglang",
        "link_gbps": args.link_gbps,
        "kv_bytes_per_token": args.kv_bytes_per_token,
        "prefill_tokens_per_s": EngineSpec().prefill_tokens_per_s * args.speedup,
    }
    # JSON is YAML: the config file as the router reads it.
    return orjson.dumps({"engines": {"static": static}, "disaggregation": section}).decode()


def start_kvrouter(fleet: Fleet, args: argparse.Namespace, tmp: Path) -> Proc:
    policy = tmp / "kv-aware.yaml"
    write_kv_aware_policy(policy, EngineSpec().capacity_tokens)
    config = tmp / "kvrouter-pd.yaml"
    config.write_text(kvrouter_config(fleet, args))
    return start_router("kvrouter kv-aware", [], tmp, policy, config=config)


def smg_flags(fleet: Fleet) -> list[str]:
    """SMG's PD-mode worker flags: each prefill engine with its bootstrap port."""
    flags = ["--pd-disaggregation"]
    for e in fleet.prefill:
        port = fleet.bootstrap_ports[e.url]
        flags += ["--prefill", e.url, "none" if port is None else str(port)]
    for e in fleet.decode:
        flags += ["--decode", e.url]
    return flags


def start_smg(fleet: Fleet, args: argparse.Namespace, tmp: Path) -> Proc:
    urls = [e.url for e in fleet.engines]
    return start_peer(SMG, urls, args.smg_policy, tmp, worker_flags=smg_flags(fleet))


# --- the client ------------------------------------------------------------------------------


@dataclass(slots=True)
class Timed:
    """One streamed request as the client saw it."""

    status: int
    first: float | None = None  # seconds from sending to the first event
    last: float | None = None  # ... to the last content event
    tokens: int = 0  # completion tokens (its usage, else its content events)
    done: bool = False

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first."""
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


async def read_timed(http: aiohttp.ClientSession, url: str, data: bytes) -> Timed:
    """POST a streamed request and read it to its end, timing its first and last tokens."""
    t0 = time.perf_counter()
    decoder = Decoder()
    events = 0
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        out = Timed(r.status)
        if r.status != 200:
            await r.read()
            return out
        async for chunk in r.content.iter_any():
            for ev in decoder.feed(chunk):
                if ev.done:
                    out.done = True
                    continue
                body = orjson.loads(ev.data)
                usage = body.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    out.tokens = usage["completion_tokens"]
                if body.get("choices"):
                    now = time.perf_counter() - t0
                    out.first = now if out.first is None else out.first
                    out.last = now
                    events += 1
    out.tokens = out.tokens or events
    return out


@dataclass
class Replay:
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        self.failures[why] = self.failures.get(why, 0) + 1


async def _send(http: aiohttp.ClientSession, url: str, req: TraceRequest, out: Replay) -> None:
    try:
        got = await read_timed(http, url + CHAT, replay_body(req, 0))
    except (TimeoutError, aiohttp.ClientError) as e:
        out.fail(type(e).__name__)
        return
    if got.status != 200 or not got.done or got.first is None:
        out.fail(f"HTTP {got.status}" if got.status != 200 else "stream cut short")
        return
    out.ttfts.append(got.first)
    if got.tpot is not None:
        out.tpots.append(got.tpot)


async def replay(url: str, trace: Sequence[TraceRequest], speedup: float) -> Replay:
    """Every request at its trace time / ``speedup`` (open loop); wait for all."""
    out = Replay()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tasks = []
        start, t_first = time.perf_counter(), trace[0].timestamp
        for req in trace:
            delay = start + (req.timestamp - t_first) / speedup - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send(http, url, req, out)))
        await asyncio.gather(*tasks)
    return out


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Row:
    router: str
    replay: Replay
    stats: list[Any]  # /stats of every engine, prefill pool first
    prefill_engines: int
    cpu_seconds: float

    @property
    def hit_ratio(self) -> float:
        return hit_ratio(self.stats)

    def cells(self) -> list[str]:
        rep, n = self.replay, len(self.replay.ttfts)
        pools = (self.stats[: self.prefill_engines], self.stats[self.prefill_engines :])
        share = " / ".join(str(sum(int(s["requests"]) for s in pool)) for pool in pools)
        moved = sum(int(s.get("transferred_tokens", 0)) for s in self.stats)
        failed = sum(rep.failures.values())
        return [
            self.router,
            f"{percentile(rep.ttfts, 50) * 1000:.0f}",
            f"{percentile(rep.ttfts, 99) * 1000:.0f}",
            f"{percentile(rep.tpots, 50) * 1000:.1f}",
            f"{self.hit_ratio:.3f}",
            " / ".join(f"{hit_ratio(pool):.3f}" for pool in pools),
            f"{moved / 1e6:.2f}",
            share,
            f"{self.cpu_seconds * 1000 / max(1, n):.2f}",
            str(failed) + (f" {rep.failures}" if failed else ""),
        ]


def measure(name: str, fleet: Fleet, args: argparse.Namespace, tmp: Path, procs: list[Proc]) -> Row:
    reset_engines(fleet.engines)
    router = start_kvrouter(fleet, args, tmp) if name == "kvrouter" else start_smg(fleet, args, tmp)
    procs.append(router)
    trace = hotspot_trace(args.requests, args.rate, args.output_scale)
    span = (trace[-1].timestamp - trace[0].timestamp) / args.speedup
    print(f"pd_live: {name}, {len(trace)} requests over {span:.0f} s", flush=True)
    cpu0 = tree_cpu_seconds(router.popen.pid)
    rep = asyncio.run(replay(router.url, trace, args.speedup))
    cpu = tree_cpu_seconds(router.popen.pid) - cpu0
    stats = engine_stats(fleet.engines)
    router.stop()
    procs.remove(router)
    return Row(name, rep, stats, len(fleet.prefill), cpu)


# The /stats counters the report reads, summed over repeated runs.
COUNTED = ("requests", "prompt_tokens", "cached_tokens", "transferred_tokens")


def pooled(rows: Sequence[Row]) -> Row:
    """One router's repeated runs as one: every request's timings, the engines' counts summed."""
    first = rows[0]
    replay = Replay()
    for r in rows:
        replay.ttfts += r.replay.ttfts
        replay.tpots += r.replay.tpots
        for why, n in r.replay.failures.items():
            replay.failures[why] = replay.failures.get(why, 0) + n
    stats = [
        {key: sum(int(r.stats[i].get(key, 0)) for r in rows) for key in COUNTED}
        for i in range(len(first.stats))
    ]
    cpu = sum(r.cpu_seconds for r in rows)
    return Row(first.router, replay, stats, first.prefill_engines, cpu)


def goal(rows: Sequence[Row]) -> str:
    """kvrouter's TTFT p99 against SMG's, with the TPOT p50 and hit ratio beside."""
    by = {r.router: r for r in rows}
    if not {"kvrouter", "smg"} <= set(by):
        return ""
    ours, smg = by["kvrouter"], by["smg"]
    ratio = percentile(ours.replay.ttfts, 99) / max(1e-9, percentile(smg.replay.ttfts, 99))
    tpot = percentile(ours.replay.tpots, 50) / max(1e-9, percentile(smg.replay.tpots, 50))
    met = ratio <= 0.8 and tpot <= 1.0 and ours.hit_ratio >= smg.hit_ratio
    return (
        f"\nkvrouter / SMG: TTFT p99 {ratio:.2f}x, TPOT p50 {tpot:.2f}x, hit ratio "
        f"{ours.hit_ratio:.3f} against {smg.hit_ratio:.3f}: goal (TTFT p99 <= 0.8x at equal or "
        f"better TPOT p50 and hit ratio) {'met' if met else 'not met'}.\n"
    )


def report(args: argparse.Namespace, rows: Sequence[Row]) -> str:
    spec = EngineSpec()
    head = (
        f"### Prefill/decode pools, SGLang's protocol: kvrouter against SMG\n\n"
        f"{args.prefill} prefill and {args.decode} decode engine-sims (--kind sglang): KV "
        f"cache {spec.capacity_tokens:,} tokens, prefill "
        f"{spec.prefill_tokens_per_s * args.speedup:,.0f} tokens/s, max batch {spec.max_batch}, "
        f"link {args.link_gbps:g} Gbps, {args.kv_bytes_per_token:,} KV bytes per token; "
        f"hotspot, {args.requests} requests at {args.rate:g} req/s, speedup {args.speedup:g}, "
        f"outputs / {max(1, args.output_scale)}; SMG --policy {args.smg_policy}; "
        f"{args.repeat} run(s) per router, alternating, pooled.\n\n"
    )
    return head + markdown_table(HEAD, [r.cells() for r in rows]) + "\n" + goal(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "smg" in args.routers and importlib.util.find_spec("smg") is None:
        print("smg is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="kvrouter-pd-") as tmp, stopping_on_sigterm():
            runs: dict[str, list[Row]] = {name: [] for name in args.routers}
            with running([]) as procs:
                fleet = start_fleet(args, Path(tmp), procs)
                for i in range(args.repeat):
                    # Alternate the order, so that drift in the machine's load hits both alike.
                    for name in args.routers if i % 2 == 0 else args.routers[::-1]:
                        runs[name].append(measure(name, fleet, args, Path(tmp), procs))
            print(report(args, [pooled(rows) for rows in runs.values()]), flush=True)
    except KeyboardInterrupt:
        print("interrupted; every process this bench started is stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
