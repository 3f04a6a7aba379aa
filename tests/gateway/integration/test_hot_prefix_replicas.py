"""A hot prefix's heat is fleet-wide: two ``kvrouter serve`` replicas gossiping on loopback.

Replica a routes a burst of long answers about one document; replica b, which routed none of
them, sees the prefix hot through a's load reports and would copy it (``spread_blocks`` in its
``/debug/route``); once the answers end, b keeps the prefix together again. The engines decode
slowly so that the burst stays in flight while b is asked. Every wait is bounded in count and
time, and every process is stopped at the end.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support import Proc, free_port, http_json, running, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

MODEL = "sim-model"
TOKEN = "hot-prefix-admin-token"
ENV = {
    "KVROUTER_GOSSIP_SECRET": "hot-prefix-gossip-secret-0123456789",
    "KVROUTER_ADMIN_TOKEN": TOKEN,
}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
DOC = " ".join(f"clause {i} of the viral document, read closely" for i in range(90))
BURST = 6  # above spread_above (2) per holder, whether a kept it on one engine or on both


def ask(question: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": DOC}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}


def route(router: Proc) -> dict[str, Any]:
    """What ``router`` would do with a question about the document, and why."""
    got: dict[str, Any] = http_json(f"{router.url}/debug/route", ask("and b?", 4), ADMIN)
    return got


def spread_blocks(router: Proc) -> int:
    return int(route(router)["spread_blocks"])


def held_not_spread(router: Proc) -> bool:
    got = route(router)
    return got["spread_blocks"] == 0 and any(c["overlap_blocks"] > 0 for c in got["candidates"])


async def answer(http: aiohttp.ClientSession, router: Proc, body: dict[str, Any]) -> int:
    async with http.post(f"{router.url}/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status


async def test_replica_spreads_a_prefix_made_hot_by_its_peer(tmp_path: Path) -> None:
    with running([]) as procs:
        engines = [
            start_kvrouter(["engine-sim", "--decode-tokens-per-s", "10"], tmp_path)
            for _ in range(2)
        ]
        procs.extend(engines)
        backends = [arg for e in engines for arg in ("--backend", e.url)]
        ports = [free_port(), free_port()]
        routers = []
        for mine, theirs in (ports, ports[::-1]):
            args = ["serve", "--host", "127.0.0.1", *backends, "--gossip-preset", "local"]
            args += ["--gossip-port", str(mine), "--gossip-peer", f"127.0.0.1:{theirs}"]
            routers.append(start_kvrouter(args, tmp_path, env=ENV, ready_path="/ready"))
            procs.append(routers[-1])
        a, b = routers
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            assert await answer(http, a, ask("what is it?", 2)) == 200
            wait_until(lambda: held_not_spread(b), "b learns who holds it")
            burst = [
                asyncio.create_task(answer(http, a, ask(f"question {i}?", 100)))
                for i in range(BURST)
            ]
            try:  # polled from a thread, so that the burst's answers stream meanwhile
                hot = lambda: spread_blocks(b) > 0  # noqa: E731
                await asyncio.to_thread(wait_until, hot, "b sees a's heat")
            finally:
                statuses = await asyncio.gather(*burst)
        assert statuses == [200] * BURST
        wait_until(lambda: spread_blocks(b) == 0, "the heat passes")
        for r in routers:
            assert r.stop() == 0
            assert "Traceback" not in r.log()
