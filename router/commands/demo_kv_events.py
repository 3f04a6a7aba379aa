"""``kvrouter demo --kv-events``: where the engines' KV cache events matter, live.

The default demo's workload, with a seeded share of it sent straight to the engines (clients
that skip the router) and engine-0 reset half-way (``POST /reset``: its cache emptied,
``AllBlocksCleared`` published), run twice through kv-aware, each time on fresh engine-sims
(all publishing KV events) and a fresh gateway: once on the router's own predictions
(approximate), once with every engine's events (precise). The hit ratio is the engines' over
all traffic (cached over prompt tokens from every response's usage), split into routed and
bypass requests; TTFT is the client's, of routed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from router.commands.demo_workload import (
    ENGINE_FLAGS,
    ENGINES,
    LOG_NAME,
    WORKLOAD,
    PhaseResult,
    Progress,
    client,
    grid,
    in_workdir,
    install_policy,
    ms,
    send,
    wait_fleet,
)
from router.commands.fleet import Proc, metric, running, start
from router.core.workload import TraceRequest, synthetic
from router.hostport import LOOPBACK, free_ports

# Engine-0 is reset when the request at this share of the workload is due.
RESET_AT = 0.5
BYPASS_SEED = 1


@dataclass
class RoutingResult:
    """One ``--kv-events`` run: what the client saw of routed and of bypass traffic."""

    routing: str
    routed: PhaseResult
    bypass: PhaseResult
    seconds: float = 0.0
    kv_events: int = 0  # events the router received (precise only)

    @property
    def requests(self) -> int:
        return self.routed.requests + self.bypass.requests

    @property
    def failed(self) -> int:
        return self.routed.failed + self.bypass.failed

    @property
    def hit_ratio(self) -> float:
        """The engines' cached over prompt tokens, over all traffic."""
        prompt = self.routed.prompt_tokens + self.bypass.prompt_tokens
        cached = self.routed.cached_tokens + self.bypass.cached_tokens
        return cached / prompt if prompt else 0.0


def bypass_plan(n: int, share: float, seed: int) -> list[int | None]:
    """Per request, None (through the router) or the engine it goes to straight: a seeded
    ``share`` of the requests, dealt to the engines round-robin."""
    rng = random.Random(seed)
    out: list[int | None] = []
    dealt = 0
    for _ in range(n):
        if rng.random() < share:
            out.append(dealt % ENGINES)
            dealt += 1
        else:
            out.append(None)
    return out


async def _drive_mixed(
    session: aiohttp.ClientSession,
    gateway: Proc,
    engines: list[Proc],
    trace: list[TraceRequest],
    plan: list[int | None],
    out: RoutingResult,
    concurrency: int,
) -> None:
    """Send ``trace`` in order, ``concurrency`` at once, each request where ``plan`` says;
    reset engine 0 when the request at RESET_AT of the trace is due."""
    indices = iter(range(len(trace)))
    reset_at = int(RESET_AT * len(trace))
    progress = Progress(out.routing, len(trace))

    async def worker() -> None:
        for i in indices:
            if i == reset_at:
                async with session.post(f"{engines[0].url}/reset") as r:
                    if r.status != 200:
                        raise RuntimeError(f"{engines[0].name}: POST /reset answered {r.status}")
            target = plan[i]
            if target is None:
                await send(session, gateway.url, trace[i], out.routed)
            else:
                await send(session, engines[target].url, trace[i], out.bypass)
            progress.tick()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.seconds = time.perf_counter() - t0
    progress.close()


async def _wait_all_healthy(session: aiohttp.ClientSession, gateway: Proc) -> None:
    """Until the gateway sees every engine healthy, so bypass and routed traffic meet the
    same fleet from the first request."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(f"{gateway.url}/ready") as r:
                if (await r.json(content_type=None)).get("healthy_backends") == ENGINES:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(
        f"the gateway did not see all {ENGINES} engines healthy in 30 s; see {gateway.log_path}"
    )


async def _routing_run(
    routing: str,
    trace: list[TraceRequest],
    plan: list[int | None],
    args: argparse.Namespace,
    workdir: Path,
) -> RoutingResult:
    """Fresh engines (every one publishing KV events) and a fresh gateway on kv-aware, told
    the events only when ``routing`` is precise; the workload once; everything stopped."""
    log = workdir / LOG_NAME
    precise = routing == "precise"
    out = RoutingResult(routing, PhaseResult(routing), PhaseResult("bypass"))
    with running() as procs:
        engines: list[Proc] = []
        gateway_args = ["serve", "--policy", str(workdir / "policy.yaml")]
        # Every port taken at once: ports chosen one at a time, each freed before its process
        # binds it, can come back twice (a gateway once lost its port to an engine's feed).
        *ports, gateway_port = free_ports(3 * ENGINES + 1)
        for i in range(ENGINES):
            port, pub, replay = ports[3 * i : 3 * i + 3]
            events = ["--kv-events-port", str(pub), "--kv-events-replay-port", str(replay)]
            engine_args = ["engine-sim", *ENGINE_FLAGS, *events]
            e = start(engine_args, log, name=f"engine-{i}", port=port, host=LOOPBACK)
            procs.append(e)
            engines.append(e)
            gateway_args += ["--backend", e.url]
            if precise:
                endpoints = f"tcp://{LOOPBACK}:{pub},tcp://{LOOPBACK}:{replay}"
                gateway_args += ["--kv-events", f"{e.url}={endpoints}"]
        gateway_port = args.port or gateway_port
        gateway = start(gateway_args, log, name="gateway", port=gateway_port, host=LOOPBACK)
        procs.append(gateway)
        async with client(args.concurrency) as session:
            await wait_fleet(engines, gateway)
            await _wait_all_healthy(session, gateway)
            await _drive_mixed(session, gateway, engines, trace, plan, out, args.concurrency)
            if precise:
                received = await asyncio.to_thread(metric, gateway, "kvrouter_kv_events_total")
                out.kv_events = int(received)
    return out


async def _main_kv_events(args: argparse.Namespace, workdir: Path) -> list[RoutingResult]:
    trace = list(synthetic(dataclasses.replace(WORKLOAD, requests=args.requests)))
    plan = bypass_plan(len(trace), args.bypass_share, BYPASS_SEED)
    install_policy("kv-aware", workdir / "policy.yaml")
    bypassed = sum(1 for t in plan if t is not None)
    print(
        f"{len(trace)} requests, {bypassed} of them straight to the engines (round-robin), "
        f"engine-0 reset at request {int(RESET_AT * len(trace))}; kv-aware twice, each time on "
        f"{ENGINES} fresh engine-sims and a fresh gateway (logs: {workdir / LOG_NAME})"
    )
    return [await _routing_run(r, trace, plan, args, workdir) for r in ("approximate", "precise")]


def _kv_table(rows: list[RoutingResult]) -> str:
    head = ["routing", "requests", "failed", "hit ratio", "routed hit", "bypass hit"]
    head += ["TTFT p50", "TTFT p99", "req/s"]
    body = [
        [
            r.routing,
            str(r.requests),
            str(r.failed),
            f"{r.hit_ratio:.3f}",
            f"{r.routed.hit_ratio:.3f}",
            f"{r.bypass.hit_ratio:.3f}",
            ms(r.routed.ttfts, 50),
            ms(r.routed.ttfts, 99),
            f"{r.requests / r.seconds:.1f}" if r.seconds else "-",
        ]
        for r in rows
    ]
    return grid(head, body)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.bypass_share < 1:
        print("demo: --bypass-share must be in [0, 1)", file=sys.stderr)
        return 2
    results = in_workdir(lambda workdir: _main_kv_events(args, workdir))
    if results is None:
        return 1
    print()
    print(_kv_table(results))
    print("(hit ratio: the engines', over all traffic; TTFT: routed requests only)")
    approximate, precise = results
    print(f"\nthe router received {precise.kv_events:,} KV events in the precise run")
    if approximate.hit_ratio > 0:
        print(
            f"precise reused {precise.hit_ratio / approximate.hit_ratio:.2f}x the prompt tokens "
            "approximate did"
        )
    return 0 if not approximate.failed and not precise.failed else 1
