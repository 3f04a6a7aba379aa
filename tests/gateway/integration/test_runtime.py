"""The serving process: /metrics on its own port, and a stop that keeps its grace period.

Real ``kvrouter serve`` and ``engine-sim`` processes on loopback; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support import (
    CHECKOUT_KVROUTER,
    ametric,
    eventually,
    free_port,
    http_json,
    metric_in,
    running,
    start_kvrouter,
    status_of,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": text}], **extra}


def test_metrics_on_their_own_port_not_on_the_api_port(tmp_path: Path) -> None:
    with running([]) as procs:
        sim = start_kvrouter(["engine-sim", "--fast"], tmp_path)
        procs.append(sim)
        mport = free_port()
        args = ["serve", "--engine", sim.url, "--metrics-port", str(mport)]
        router = start_kvrouter(args, tmp_path, ready_path="/ready")
        procs.append(router)
        http_json(f"{router.url}{CHAT}", chat("hello"))
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert metric_in(text, "kvrouter_requests_total", route=CHAT, code="200") == 1
        assert sim.url in text  # engine names live here, not on the API port
        assert status_of(f"{router.url}/metrics") == 404
        assert status_of(f"http://127.0.0.1:{mport}/v1/models") == 404
        # The same port for both is refused before anything listens.
        port = str(free_port())
        same = [*CHECKOUT_KVROUTER, "serve", "--engine", sim.url, "--port", port]
        same += ["--metrics-port", port]
        done = subprocess.run(same, capture_output=True, timeout=60, check=False)
        assert done.returncode == 2 and b"metrics_port: must differ" in done.stderr


async def test_stop_cuts_what_outlives_the_grace_period_with_clean_errors(
    tmp_path: Path,
) -> None:
    """SIGTERM: readiness false at once; at the grace's end a stream gets an SSE error event
    and a request still waiting for its first byte a 503; the process exits 0."""
    with running([]) as procs:
        # Two tokens a second: a 400-token answer would stream for minutes.
        sim = start_kvrouter(["engine-sim", "--decode-tokens-per-s", "2"], tmp_path)
        procs.append(sim)
        cfg = tmp_path / "drain.yaml"
        cfg.write_text("drain: {grace_seconds: 1.5}\n")
        router = start_kvrouter(
            ["serve", "--engine", sim.url, "--config", str(cfg)], tmp_path, ready_path="/ready"
        )
        procs.append(router)
        http_json(f"{sim.url}/fault", {"mode": "hang", "count": 1})
        conn = aiohttp.TCPConnector(limit=3)
        async with aiohttp.ClientSession(connector=conn) as http:
            hanging = asyncio.create_task(_post(http, f"{router.url}{CHAT}", chat("wait")))

            # The hang is armed for the first request only.
            async def the_first_request_reached_the_engine() -> bool:
                return await ametric(router, "kvrouter_backend_inflight_requests") == 1

            await eventually(the_first_request_reached_the_engine)
            stream = await http.post(
                f"{router.url}{CHAT}", json=chat("talk", stream=True, max_tokens=400)
            )
            assert stream.status == 200
            first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 30)
            assert first.startswith(b"data: ")
            # A connection kept alive from before the stop, to ask /ready on it after.
            async with http.get(f"{router.url}/ready") as r:
                assert r.status == 200
            router.popen.send_signal(signal.SIGTERM)

            async def ready_turned_503() -> bool:
                async with http.get(f"{router.url}/ready") as r:
                    if r.status != 503:
                        return False
                    assert r.headers.get("Connection", "").lower() == "close"
                    return True

            await eventually(ready_turned_503, timeout=5)  # the drain starts at once
            rest = await asyncio.wait_for(stream.content.read(), 60)
            status, body = await asyncio.wait_for(hanging, 60)
        events = [e for e in rest.split(b"\n\n") if e.startswith(b"data: {")]
        last = json.loads(events[-1][len(b"data: ") :])
        assert last["error"]["code"] == "server_shutting_down"
        assert status == 503 and body["error"]["code"] == "server_shutting_down"
        assert router.popen.wait(60) == 0, router.log()
        log = router.log()
        assert "cutting 2 request(s) still in flight" in log and "Traceback" not in log


async def _post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json()
