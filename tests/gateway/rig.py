"""The gateway in-process over ``FakeUpstream``, behind aiohttp's ``TestServer``: the rig the
exchange's, the app's and the inbound side's tests share.

Every test that uses ``rig`` ends by checking that the load the router took is all given back
(its local counters and the ``kvrouter_backend_inflight_*`` gauges are zero) and that every
upstream response was released or aborted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from router.gateway.app import build_app
from router.gateway.config.engines import EngineSources
from router.gateway.config.serving import Limits, Timeouts
from router.gateway.config.settings import Config, HealthSettings
from router.gateway.openai import sse
from router.gateway.wiring import Gateway
from tests.fakes import FakeEngine, FakeUpstream
from tests.support import eventually, metric_in

A, B, C = "http://engine-a:8000", "http://engine-b:8000", "http://engine-c:8000"
CHAT = "/v1/chat/completions"
TOKEN = "s3cret-token"

POLICY = """
version: 1
name: test-kv
block_chars: 16
filters:
  - type: bounded-load
    epsilon: 0.5
scorers:
  - type: prefix-overlap
    weight: 2
  - type: load
    weight: 1
"""

# An event whose content is the end marker's text: only a whole ``data: [DONE]`` event ends.
EVENT = sse.encode(b'{"choices": [{"delta": {"content": "data: [DONE]"}}]}')


def chat(text: str = "hello there, how are you today?", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def config(*urls: str, **changes: Any) -> Config:
    cfg = Config(
        engines=EngineSources(static=urls),
        # Probes run once at start; tests drive health themselves.
        health=HealthSettings(interval_seconds=3600, eject_after_failures=3),
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=0.3, idle_stream_seconds=0.3),
        limits=Limits(max_body_bytes=4096, max_attempts=3),
    )
    return dataclasses.replace(cfg, **changes)


@dataclasses.dataclass
class Rig:
    client: TestClient[Any, Any]
    gw: Gateway
    up: FakeUpstream

    async def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.client.post(path, data=data, **kw) as r:
            raw = await r.read()
            return r.status, orjson.loads(raw) if raw[:1] in (b"{", b"[") else raw

    async def metric(self, name: str, **labels: str) -> float:
        return metric_in(await (await self.client.get("/metrics")).text(), name, **labels)


async def assert_all_released(rig: Rig) -> None:
    """Load, leases and claims back to zero, and every upstream response closed one way or
    another."""
    core = rig.gw.core

    def released() -> None:
        assert core.loads.local_all() == {}
        assert core.outstanding == 0 and not core.predictions
        assert rig.up.unfinished() == []

    # A cancelled handler finishes its cleanup on the next loop turns.
    await eventually(released, timeout=1.0, interval=0.005)
    text = await (await rig.client.get("/metrics")).text()
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("kvrouter_backend_inflight"):
            assert all(s.value == 0 for s in fam.samples), fam


async def ready_now(client: TestClient[Any, Any]) -> bool:
    """True once the gateway's /ready answers 200."""
    return (await client.get("/ready")).status == 200


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *engines: FakeEngine,
    env: dict[str, str] | None = None,
    ready: bool = True,
    policy_text: str = POLICY,
    **changes: Any,
) -> AsyncIterator[Rig]:
    engines = engines or (FakeEngine(A), FakeEngine(B))
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    up = FakeUpstream(*engines)
    gw = Gateway(
        config(*(e.url for e in engines), **changes), policy, upstream=up, environ=env or {}
    )
    client = TestClient(TestServer(build_app(gw)))
    await client.start_server()
    r = Rig(client, gw, up)
    try:
        if ready:
            await eventually(lambda: ready_now(client), timeout=5.0, interval=0.01)
        yield r
        await assert_all_released(r)
    finally:
        await client.close()
    assert up.closed
