"""Flow control under overload: offered load twice what the fleet can serve.

Two timed engine-sims (``--max-batch`` slots each) behind ``kvrouter serve`` with flow control
capped at the engines' batch size. Three phases, back to back:

1. unloaded: requests one at a time, each class (priority -1, the small tenant), for the
   TTFT they get with nobody in the way;
2. capacity: a closed loop as wide as the fleet's slots, for the requests per second the
   fleet completes when it is exactly full, while urgent and small-tenant requests are sent
   one at a time for the TTFT they get when every request waits for a slot to free;
3. overload: Poisson arrivals at ``--factor`` x that capacity for ``--seconds``, from two
   tenants (one sending ``--ratio`` times the other), ``--urgent`` of them at priority -1.

It prints one JSON object: 5xx answers (goal 0), 429s and whether every one carried
Retry-After, goodput against capacity (goal >= 0.9), and TTFT p99 of the urgent requests and
of the small tenant against their unloaded values (goals <= 1.5x and <= 2x) and against their
values with the fleet exactly full (what fair queueing can promise: see bench/RESULTS.md).

    python -m bench.overload [--seconds 60] [--factor 2.0] [--batch 8] [--reserve 1]
        [--waiting-threshold 1] [--no-flow-control]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from router.commands.fleet import Proc, running, start_ready
from router.core.stats import percentile
from router.hostport import LOOPBACK

CHAT = "/v1/chat/completions"


@dataclass
class Outcome:
    klass: str
    status: int
    ttft: float = 0.0
    retry_after: bool = False


def body(i: int, tokens: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"request {i}: " + "tell me more " * 40}],
        "max_tokens": tokens,
        "stream": True,
    }


async def one(http: aiohttp.ClientSession, url: str, i: int, klass: str, tokens: int) -> Outcome:
    headers = {"x-kvrouter-tenant": "small" if klass == "small" else "big"}
    if klass == "urgent":
        headers["x-kvrouter-priority"] = "-1"
    t0 = time.perf_counter()
    try:
        async with http.post(url + CHAT, json=body(i, tokens), headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return Outcome(klass, resp.status, retry_after="Retry-After" in resp.headers)
            first = 0.0
            async for chunk in resp.content.iter_any():
                if not first and b"data:" in chunk:
                    first = time.perf_counter() - t0
            return Outcome(klass, 200, first)
    except aiohttp.ClientError:
        return Outcome(klass, 0)


async def unloaded(url: str, tokens: int, n: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        out: dict[str, list[float]] = {"urgent": [], "small": []}
        for i in range(n):
            for klass in out:
                r = await one(http, url, 10_000 + i, klass, tokens)
                out[klass].append(r.ttft)
    return {k: percentile(v, 99) for k, v in out.items()}


async def capacity(
    url: str, slots: int, tokens: int, seconds: float, reserved: int = 0
) -> tuple[float, dict[str, float]]:
    """Requests/s a closed loop as wide as the fleet's slots completes, and the TTFT p99 of
    urgent and small-tenant requests sent one at a time meanwhile (the fleet exactly full:
    each waits for a slot to free, but behind nobody). ``reserved`` of the loop's workers send
    priority -1, so that slots kept for urgent requests count in the capacity too."""
    done = 0
    deadline = time.perf_counter() + seconds
    probes: dict[str, list[float]] = {"urgent": [], "small": []}

    async def probe() -> None:
        nonlocal done
        await asyncio.sleep(2.0)  # the loop fills the fleet first
        i = 0
        while time.perf_counter() < deadline - 1.0:
            for klass in probes:
                r = await one(http, url, 30_000 + i, klass, tokens)
                if r.status == 200:
                    probes[klass].append(r.ttft)
                    done += 1
            i += 1

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            klass = "urgent" if w < reserved else "big"
            r = await one(http, url, 20_000 + w * 100_000 + i, klass, tokens)
            done += r.status == 200
            i += 1

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(probe(), *(worker(w) for w in range(slots)))
    return done / (time.perf_counter() - t0), {k: percentile(v, 99) for k, v in probes.items()}


async def overload(
    url: str, rate: float, seconds: float, tokens: int, ratio: float, urgent: float
) -> tuple[list[Outcome], float]:
    rng = random.Random(7)
    tasks: list[asyncio.Task[Outcome]] = []
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        i = 0
        next_at = t0
        while next_at - t0 < seconds and i < int(rate * seconds * 3):
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            u = rng.random()
            klass = "urgent" if u < urgent else ("small" if u < urgent + 1 / (ratio + 1) else "big")
            tasks.append(asyncio.create_task(one(http, url, i, klass, tokens)))
            i += 1
            next_at += rng.expovariate(rate)
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="overload phase length")
    ap.add_argument("--factor", type=float, default=2.0, help="offered load / capacity")
    ap.add_argument("--batch", type=int, default=8, help="slots per engine")
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    # Slow decode keeps the fleet's capacity low enough that the load generator, the router
    # and the engines (all on this machine) are never what saturates first.
    ap.add_argument("--decode", type=float, default=25.0, help="engine decode tokens/s")
    ap.add_argument("--ratio", type=float, default=10.0, help="big tenant / small tenant")
    ap.add_argument("--urgent", type=float, default=0.1, help="share at priority -1")
    ap.add_argument("--reserve", type=int, default=1, help="slots per engine for priority < 0")
    ap.add_argument("--no-flow-control", action="store_true", help="the baseline")
    ap.add_argument(
        "--waiting-threshold",
        type=int,
        default=1,
        help="flow_control.engine_waiting_threshold (0: ignore the engines' reports)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, running([]) as procs:
        tmp = Path(d)
        sim = ["--max-batch", str(args.batch), "--prefill-tokens-per-s", "20000"]
        sim += ["--decode-tokens-per-s", str(args.decode)]
        engines: list[Proc] = [start_ready(["engine-sim", *sim], tmp) for _ in range(2)]
        procs.extend(engines)
        config = tmp / "serve.yaml"
        cap = 0 if args.no_flow_control else args.batch
        config.write_text(
            f"flow_control: {{max_inflight_per_engine: {cap}, max_wait_seconds: 10, "
            f"priority_reserve: {args.reserve if cap else 0}, "
            f"engine_waiting_threshold: {args.waiting_threshold}}}\n"
            "limits: {max_attempts: 1}\n"
        )
        cmd = ["serve", "--config", str(config), "--host", LOOPBACK, "--policy", "least-load"]
        for e in engines:
            cmd += ["--engine", e.url]
        router = start_ready(cmd, tmp, ready_path="/ready")
        procs.append(router)
        base = asyncio.run(unloaded(router.url, args.tokens, 20))
        reserved = 2 * args.reserve if cap else 0
        cap_rps, full = asyncio.run(
            capacity(router.url, 2 * args.batch, args.tokens, 15.0, reserved)
        )
        rate = args.factor * cap_rps
        results, took = asyncio.run(
            overload(router.url, rate, args.seconds, args.tokens, args.ratio, args.urgent)
        )
    ok = [r for r in results if r.status == 200]
    limited = [r for r in results if r.status == 429]

    def p99(klass: str) -> float:
        return percentile([r.ttft for r in ok if r.klass == klass], 99)

    report = {
        "flow_control": not args.no_flow_control,
        "capacity_rps": round(cap_rps, 2),
        "offered_rps": round(rate, 2),
        "requests": len(results),
        "ok": len(ok),
        "status_5xx": sum(r.status >= 500 for r in results),
        "connection_errors": sum(r.status == 0 for r in results),
        "status_429": len(limited),
        "every_429_has_retry_after": all(r.retry_after for r in limited),
        "goodput_vs_capacity": round(len(ok) / took / cap_rps, 3),
        "urgent_ttft_p99_unloaded": round(base["urgent"], 4),
        "urgent_ttft_p99": round(p99("urgent"), 4),
        "urgent_ratio": round(p99("urgent") / base["urgent"], 2),
        "urgent_ttft_p99_fleet_full": round(full["urgent"], 4),
        "urgent_ratio_to_full": round(p99("urgent") / full["urgent"], 2),
        "small_ttft_p99_unloaded": round(base["small"], 4),
        "small_ttft_p99": round(p99("small"), 4),
        "small_ratio": round(p99("small") / base["small"], 2),
        "small_ttft_p99_fleet_full": round(full["small"], 4),
        "small_ratio_to_full": round(p99("small") / full["small"], 2),
        "big_ttft_p99": round(p99("big"), 4),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
