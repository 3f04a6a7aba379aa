"""``kvrouter demo``: a live side-by-side of round-robin and kv-aware on real processes.

Starts four engine-sims and the gateway on free loopback ports, drives a multi-tenant,
multi-turn chat workload through the gateway with round-robin, hot-reloads the policy file to
kv-aware (no restart), clears the engines' caches, drives the same workload again, and prints
hit ratio, TTFT and throughput for both. Everything it starts is stopped at the end.

``--kv-events`` runs instead the comparison of approximate and precise kv-aware routing of
router.commands.demo_kv_events. Both modes share router.commands.demo_workload (engines,
workload, client, tables) and router.commands.fleet (the processes).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from functools import partial
from pathlib import Path

import aiohttp

from router.commands import demo_kv_events
from router.commands.demo_workload import (
    CONCURRENCY,
    ENGINE_FLAGS,
    ENGINES,
    LOG_NAME,
    WORKLOAD,
    PhaseResult,
    Progress,
    client,
    counting_quality,
    grid,
    in_workdir,
    install_policy,
    ms,
    send,
    wait_fleet,
)
from router.commands.fleet import Proc, metric, running, start, wait_until
from router.core.workload import TraceRequest, synthetic
from router.hostport import LOOPBACK, free_ports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=WORKLOAD.requests, help="per policy")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--port", type=int, default=0, help="gateway port (0: a free one)")
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="instead: kv-aware approximate against precise (the engines' KV cache events), "
        "with traffic bypassing the router and one engine reset half-way",
    )
    parser.add_argument(
        "--bypass-share",
        type=float,
        default=0.2,
        help="with --kv-events: share of requests sent straight to the engines (default: 0.2)",
    )


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    trace: list[TraceRequest],
    policy: str,
    concurrency: int,
) -> PhaseResult:
    out = PhaseResult(policy)
    queue: asyncio.Queue[TraceRequest] = asyncio.Queue()
    # Requests start in arrival order, up to ``concurrency`` at once.
    for r in trace:
        queue.put_nowait(r)
    progress = Progress(policy, len(trace))

    async def worker() -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await send(session, url, req, out)
            progress.tick()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.seconds = time.perf_counter() - t0
    progress.close()
    return out


def _reloaded(gateway: Proc, count: int) -> bool:
    return metric(gateway, "kvrouter_policy_reloads_total", result="success") >= count


def _table(rows: list[PhaseResult]) -> str:
    head = ["policy", "requests", "failed", "hit ratio", "reachable", "achieved"]
    head += ["TTFT p50", "TTFT p99", "req/s"]
    body = [
        [
            r.policy,
            str(r.requests),
            str(r.failed),
            f"{r.hit_ratio:.3f}",
            r.share("reachable"),
            r.share("achieved"),
            ms(r.ttfts, 50),
            ms(r.ttfts, 99),
            f"{r.requests / r.seconds:.1f}" if r.seconds else "-",
        ]
        for r in rows
    ]
    return grid(head, body)


async def _main(args: argparse.Namespace, workdir: Path) -> list[PhaseResult]:
    spec = dataclasses.replace(WORKLOAD, requests=args.requests)
    trace = list(synthetic(spec))
    log = workdir / LOG_NAME
    policy_file = workdir / "policy.yaml"
    install_policy("round-robin", policy_file)
    with running() as procs:
        print(f"starting {ENGINES} engine-sims and the gateway (logs: {log})")
        # Every port taken at once, so that none comes back twice (see ``demo_kv_events``).
        *ports, gateway_port = free_ports(ENGINES + 1)
        for i, port in enumerate(ports):
            engine = ["engine-sim", *ENGINE_FLAGS]
            procs.append(start(engine, log, name=f"engine-{i}", port=port, host=LOOPBACK))
        engines = list(procs)
        backends = [a for e in engines for a in ("--backend", e.url)]
        gateway_args = ["serve", *backends, "--policy", str(policy_file)]
        gateway_port = args.port or gateway_port
        gateway = start(gateway_args, log, name="gateway", port=gateway_port, host=LOOPBACK)
        procs.append(gateway)
        async with client(args.concurrency) as session:
            await wait_fleet(engines, gateway)
            print(f"gateway {gateway.url} in front of {', '.join(e.url for e in engines)}")
            rr = _drive(session, gateway.url, trace, "round-robin", args.concurrency)
            results = [await counting_quality(gateway, rr)]
            print("hot-reloading the policy file to kv-aware and clearing the engines' caches")
            for e in engines:
                async with session.post(f"{e.url}/reset") as r:
                    r.raise_for_status()
            install_policy("kv-aware", policy_file)
            what = "the gateway to pick up the new policy"
            await asyncio.to_thread(wait_until, partial(_reloaded, gateway, 1), what, 20)
            kv = _drive(session, gateway.url, trace, "kv-aware", args.concurrency)
            results.append(await counting_quality(gateway, kv))
    return results


def run(args: argparse.Namespace) -> int:
    if args.kv_events:
        return demo_kv_events.run(args)
    results = in_workdir(lambda workdir: _main(args, workdir))
    if results is None:
        return 1
    print()
    print(_table(results))
    print(
        "\nreachable: the share of prompt tokens the deepest eligible engine held, as the "
        "router believed;\nachieved: the share the engines reported cached, as the router "
        "counted (kvrouter_prefix_*_tokens_total)"
    )
    rr, kv = results
    if rr.hit_ratio > 0:
        print(
            f"\nkv-aware reused {kv.hit_ratio / rr.hit_ratio:.1f}x the prompt tokens "
            "round-robin did"
        )
    return 0 if not rr.failed and not kv.failed else 1
