"""One sick engine costs no client request while another can serve; a sick fleet still has a
retry budget.

Real processes: two ``engine-sim`` engines and ``kvrouter serve``. An engine is made sick by
its own fault hook (``POST /fault``: hang, or a 503 on every other request) or by killing its
process, and brought back on the same port. The retry budget's floor (3 retries in flight)
is below what each scenario needs, so the scenarios pass only because retries away from one
failing engine are free; the last test shows the budget still refusing when every engine
fails. Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import Proc, ametric, eventually, http_json, running, start_kvrouter

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
CONFIG = """
policy: {policy}
health: {{interval_seconds: 0.3, timeout_seconds: 1, eject_after_failures: 3,
         readmit_backoff_seconds: 0.5, readmit_backoff_max_seconds: 1}}
timeouts: {{connect_seconds: 1, first_byte_seconds: 20, idle_stream_seconds: 5}}
limits: {{max_attempts: 3, retry_budget_percent: 20}}
"""


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    with running() as held:
        yield held


def start(tmp: Path, procs: list[Proc], policy: str = "kv-aware") -> tuple[list[Proc], Proc]:
    engines = [start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2)]
    procs.extend(engines)
    config = tmp / "serve.yaml"
    config.write_text(CONFIG.format(policy=policy))
    args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
    for e in engines:
        args += ["--engine", e.url]
    router = start_kvrouter(args, tmp, env=ADMIN_ENV, ready_path="/ready")
    procs.append(router)
    return engines, router


def body(i: int, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question number {i} " * 20}],
        "max_tokens": 4,
        "stream": stream,
    }


async def statuses(router: Proc, n: int, stream: bool = False) -> list[int]:
    """``n`` requests at once; the status each client saw."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(router.url, timeout=timeout) as http:

        async def one(i: int) -> int:
            async with http.post(CHAT, json=body(i, stream)) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def inflight(router: Proc, engine: Proc) -> int:
    backends = http_json(f"{router.url}/debug/backends", headers=ADMIN)["backends"]
    return int(next(b["inflight_requests"] for b in backends if b["url"] == engine.url))


async def assert_released(router: Proc, engines: list[Proc]) -> None:
    async def zero() -> bool:
        name = "kvrouter_backend_inflight_requests"
        return [await ametric(router, name, backend=e.url) for e in engines] == [0] * len(engines)

    await eventually(zero, timeout=10)


async def test_engine_killed_before_first_byte_every_client_served(
    tmp_path: Path, procs: list[Proc]
) -> None:
    # Round-robin: five of the ten requests land on the victim, which holds them unanswered.
    (victim, survivor), router = start(tmp_path, procs, policy="round-robin")
    http_json(f"{victim.url}/fault", {"mode": "hang", "count": 10})
    load = asyncio.ensure_future(statuses(router, 10))
    await eventually(lambda: inflight(router, victim) == 5, timeout=15)
    victim.popen.kill()
    assert await asyncio.wait_for(load, 30) == [200] * 10
    assert await ametric(router, "kvrouter_retries_refused_total") == 0
    assert await ametric(router, "kvrouter_retries_total") == 5
    await assert_released(router, [victim, survivor])


async def test_engine_failing_every_other_request_every_client_served(
    tmp_path: Path, procs: list[Proc]
) -> None:
    (sick, well), router = start(tmp_path, procs, policy="round-robin")
    http_json(f"{sick.url}/fault", {"mode": "status", "status": 503, "count": 40, "every": 2})
    got = await statuses(router, 40)
    assert got == [200] * 40
    assert await ametric(router, "kvrouter_retries_total") >= 5  # the sick engine failed
    assert await ametric(router, "kvrouter_retries_refused_total") == 0
    await assert_released(router, [sick, well])


async def test_engine_restarting_under_streams_no_unstarted_request_fails(
    tmp_path: Path, procs: list[Proc]
) -> None:
    (flapper, steady), router = start(tmp_path, procs)
    port = int(flapper.url.rsplit(":", 1)[1])
    refused: list[int] = []  # statuses other than 200: what the flapping cost clients
    done = asyncio.Event()
    served = itertools.count()

    async def client(k: int) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(router.url, timeout=timeout) as http:
            for i in range(400):  # bounded; the flapping ends the loop first
                if done.is_set():
                    return
                async with http.post(CHAT, json=body(k * 1000 + i, stream=True)) as r:
                    await r.read()  # a stream begun on the killed engine may end in an error event
                    if r.status != 200:
                        refused.append(r.status)
                next(served)
                await asyncio.sleep(0.01)

    clients = [asyncio.ensure_future(client(k)) for k in range(8)]
    try:
        for _ in range(4):  # kill and restart on the same port, every ~1.5 s
            await asyncio.sleep(1.5)
            flapper.popen.kill()
            flapper.reap()
            await asyncio.sleep(0.5)
            flapper = start_kvrouter(["engine-sim", "--fast"], tmp_path, port=port)
            procs.append(flapper)
    finally:
        done.set()
        await asyncio.wait_for(asyncio.gather(*clients), 30)
    assert next(served) > 40  # traffic really flowed through the flapping
    assert refused == []
    await assert_released(router, [flapper, steady])


async def test_every_engine_failing_the_budget_still_refuses_a_storm(
    tmp_path: Path, procs: list[Proc]
) -> None:
    engines, router = start(tmp_path, procs)
    for e in engines:
        http_json(f"{e.url}/fault", {"mode": "status", "status": 503, "count": 1000})
    got = await statuses(router, 30)
    assert set(got) <= {502, 503}  # every engine failed it, or the budget refused a retry
    # Each request may try every engine; the budget let only a few of those retries happen.
    assert await ametric(router, "kvrouter_retries_refused_total") > 0
    assert await ametric(router, "kvrouter_retries_total") < 30
    await assert_released(router, engines)
