"""Live hit ratio of one agent conversation through each front door: chat, Responses, Messages.

For each API, fresh ``--engines`` ``engine-sim --fast`` processes (real LRU prefix caches of
``--kv-capacity-tokens``; no model delays) and a fresh ``kvrouter serve`` (kv-aware) in front
of them; then ``--agents`` tool-calling agents (router.core.agent_workload) hold a
``--turns``-turn conversation through the gateway, every agent's turn of a round in flight at
once, the rounds one after another, streamed. The same scripted content goes through every
door, each in its own API's shape.

Reported per API: the engines' hit ratio (cached prompt tokens over prompt tokens, their own
``/stats``), and the gateway's (``kvrouter_cached_tokens_total`` over
``kvrouter_prompt_tokens_total``, read from each API's usage fields), which must agree.

    python -m bench.front_doors [--agents 8] [--turns 10] [--engines 4]
        [--kv-capacity-tokens 400000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import markdown_table
from router.commands.fleet import Proc, http_json, metric, running, start_ready, wait_until
from router.core.agent_workload import APIS, AgentSpec, agent_bodies
from router.hostport import LOOPBACK

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


async def drive(url: str, spec: AgentSpec, api: str) -> int:
    """Every turn of every agent, a round at a time; the number of requests that failed."""
    rounds: dict[int, list[dict[str, Any]]] = {}
    for i, (_at, body) in enumerate(agent_bodies(spec, api)):
        streamed = {**body, "stream": True}
        if api == "chat":  # the other two APIs' streams always report usage
            streamed["stream_options"] = {"include_usage": True}
        rounds.setdefault(i // spec.agents, []).append(streamed)
    failed = 0
    async with aiohttp.ClientSession() as http:

        async def one(body: dict[str, Any]) -> bool:
            async with http.post(url + PATHS[api], json=body) as resp:
                await resp.read()
                return resp.status == 200

        for bodies in rounds.values():
            done = await asyncio.gather(*(one(b) for b in bodies))
            failed += done.count(False)
    return failed


def run(api: str, spec: AgentSpec, engines: int, capacity: int, tmp: Path) -> dict[str, Any]:
    with running([]) as procs:
        sims: list[Proc] = []
        for _ in range(engines):
            sim = start_ready(["engine-sim", "--fast", "--kv-capacity-tokens", str(capacity)], tmp)
            procs.append(sim)
            sims.append(sim)
        args = ["serve", "--host", LOOPBACK, "--log-level", "warning"]
        for s in sims:
            args += ["--backend", s.url]
        router = start_ready(args, tmp, ready_path="/ready")
        procs.append(router)
        wait_until(
            lambda: http_json(f"{router.url}/ready")["healthy_backends"] == engines,
            "every engine healthy",
            30.0,
        )
        failed = asyncio.run(drive(router.url, spec, api))
        stats = [http_json(f"{s.url}/stats") for s in sims]
        prompt = sum(s["prompt_tokens"] for s in stats)
        cached = sum(s["cached_tokens"] for s in stats)
        seen_prompt = metric(router, "kvrouter_prompt_tokens_total")
        seen_cached = metric(router, "kvrouter_cached_tokens_total")
    return {
        "api": api,
        "requests": sum(s["requests"] for s in stats),
        "failed": failed,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_ratio": cached / prompt if prompt else 0.0,
        "gateway_hit_ratio": seen_cached / seen_prompt if seen_prompt else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--kv-capacity-tokens", type=int, default=400_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    spec = AgentSpec(agents=args.agents, turns=args.turns)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(api, spec, args.engines, args.kv_capacity_tokens, Path(tmp)) for api in APIS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    chat = rows[0]["hit_ratio"]
    print(
        f"{args.agents} agents x {args.turns} turns, {args.engines} engine-sims "
        f"({args.kv_capacity_tokens} tokens each), kv-aware"
    )
    table = [
        [
            r["api"],
            str(r["requests"]),
            str(r["failed"]),
            str(r["prompt_tokens"]),
            f"{r['hit_ratio']:.4f}",
            f"{r['gateway_hit_ratio']:.4f}",
            f"{r['hit_ratio'] / chat:.4f}" if chat else "-",
        ]
        for r in rows
    ]
    head = ["api", "requests", "failed", "prompt tokens", "hit ratio", "gateway's", "vs chat"]
    print(markdown_table(head, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
