"""What the gateway costs: added time-to-first-token, router CPU per request, throughput.

Starts ``kvrouter engine-sim --fast`` (no model delays, so what is measured is plumbing) and
``kvrouter serve`` in front of it, on loopback, then:

1. latency: one streamed chat request at a time, alternating direct-to-engine and through the
   router on keep-alive connections; TTFT is the time from sending the request to the first
   ``data:`` bytes. Reports p50 and p99 of each and the router's added p50 / p99.
2. load: at each concurrency, a fixed number of streamed requests through the router; reports
   throughput and the router process's CPU time per request (utime + stime from
   /proc/<pid>/stat before and after; Linux only).

The client, the router and the engine share this machine's cores, so absolute numbers move
with the machine; compare rows of one run.

    python -m bench.proxy_overhead [--requests 300] [--load-requests 2000]
                                   [--concurrency 32 256] [--prompt-chars 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.support import Proc, running, start_kvrouter

CHAT = "/v1/chat/completions"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def body(i: int, prompt_chars: int, max_tokens: int) -> dict[str, object]:
    system = ("You are a careful assistant. " * (prompt_chars // 29 + 1))[:prompt_chars]
    return {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {i}"},
        ],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def ttft(http: aiohttp.ClientSession, url: str, payload: dict[str, object]) -> float:
    """Seconds to the first event of a streamed request (the stream is then read to its end)."""
    t0 = time.perf_counter()
    first = 0.0
    async with http.post(url + CHAT, json=payload) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            if not first and b"data:" in chunk:
                first = time.perf_counter() - t0
    return first


def pct(values: list[float], q: int) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)
    )


async def latency(
    engine: str, router: str, n: int, prompt_chars: int, max_tokens: int
) -> dict[str, float]:
    direct: list[float] = []
    routed: list[float] = []
    async with aiohttp.ClientSession() as http:
        for i in range(20):  # warm-up: connections, caches, the router's index
            await ttft(http, engine, body(i, prompt_chars, max_tokens))
            await ttft(http, router, body(i, prompt_chars, max_tokens))
        for i in range(n):
            payload = body(i, prompt_chars, max_tokens)
            direct.append(await ttft(http, engine, payload))
            routed.append(await ttft(http, router, payload))
    return {
        "direct_p50": pct(direct, 50),
        "direct_p99": pct(direct, 99),
        "router_p50": pct(routed, 50),
        "router_p99": pct(routed, 99),
    }


async def load(
    router: str, pid: int, total: int, concurrency: int, prompt_chars: int, max_tokens: int
) -> dict[str, float]:
    queue = iter(range(total))
    failures = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal failures
            for i in queue:
                try:
                    await ttft(http, router, body(i, prompt_chars, max_tokens))
                except aiohttp.ClientError:
                    failures += 1

        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    return {
        "requests_per_s": total / (t1 - t0),
        "cpu_ms_per_request": (cpu1 - cpu0) * 1000 / total,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    p.add_argument("--load-requests", type=int, default=2000, help="requests per concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 256])
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        tmp_path = Path(tmp)
        engine = start_kvrouter(["engine-sim", "--fast"], tmp_path)
        procs.append(engine)
        router: Proc = start_kvrouter(
            ["serve", "--host", "127.0.0.1", "--backend", engine.url, "--log-level", "warning"],
            tmp_path,
            ready_path="/ready",
        )
        procs.append(router)
        lat = asyncio.run(
            latency(engine.url, router.url, args.requests, args.prompt_chars, args.max_tokens)
        )
        rows = [
            (
                c,
                asyncio.run(
                    load(
                        router.url,
                        router.popen.pid,
                        args.load_requests,
                        c,
                        args.prompt_chars,
                        args.max_tokens,
                    )
                ),
            )
            for c in args.concurrency
        ]

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
    print(f"Through the router, {args.load_requests} streamed requests per row")
    print(f"  {'concurrency':>11} {'req/s':>9} {'router CPU ms/req':>18} {'failures':>9}")
    for c, r in rows:
        rps, cpu, failed = r["requests_per_s"], r["cpu_ms_per_request"], int(r["failures"])
        print(f"  {c:>11} {rps:9.1f} {cpu:18.3f} {failed:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
