"""The picker in-process over the gateway rig (router.gateway.extproc behind
tests.gateway.rig), asked by ``ExtProcFilter`` over real gRPC on loopback.

Engines are the rig's fakes, named by host names that a fake resolver maps to IP addresses,
since Envoy is only ever given addresses. The rig's exit checks that all load was given back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson

from router.gateway.extproc.endpoints import Endpoints
from router.gateway.extproc.server import PickerServer
from router.hostport import LOOPBACK
from tests.fakes import FakeEngine
from tests.gateway.extproc.envoy_standin import ExtProcFilter, FilterConfig, Routed, channel_to
from tests.gateway.rig import CHAT, Rig, rig
from tests.support import metric_in

ADDRESSES = {"engine-a": "10.0.0.1", "engine-b": "10.0.0.2", "engine-c": "10.0.0.3"}
EP_A, EP_B, EP_C = (f"{ip}:8000" for ip in ADDRESSES.values())


async def fake_resolve(host: str, port: int) -> str:
    if host not in ADDRESSES:
        raise OSError(f"{host}: no such host (fake)")
    return ADDRESSES[host]


@dataclass
class Picking:
    rig: Rig
    server: PickerServer
    channel: grpc.aio.Channel

    def filter(self, config: FilterConfig | None = None) -> ExtProcFilter:
        return ExtProcFilter(self.channel, config)

    async def ask(
        self, body: Any, config: FilterConfig | None = None, path: str = CHAT, **kw: Any
    ) -> tuple[ExtProcFilter, Routed]:
        """One request phase; the filter stays open for the response phase."""
        f = self.filter(config)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = kw.pop("headers", {"content-type": "application/json"})
        return f, await f.request("POST", path, headers, raw, **kw)

    async def route(self, body: Any, config: FilterConfig | None = None, **kw: Any) -> Routed:
        """A whole request: the pick, then a 200 with usage from the endpoint picked."""
        f, routed = await self.ask(body, config, **kw)
        if routed.immediate is None:
            answer = {"choices": [], "usage": usage(10, 0)}
            await f.respond(200, [orjson.dumps(answer)], served=routed.endpoints[0])
        else:
            await f.close()
        return routed

    def metric(self, name: str, **labels: str) -> float:
        return metric_in(self.rig.gw.metrics.exposition().decode(), name, **labels)


def usage(prompt: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": 1,
        "total_tokens": prompt + 1,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


@asynccontextmanager
async def picking(tmp_path: Path, *engines: FakeEngine, **changes: Any) -> AsyncIterator[Picking]:
    async with rig(tmp_path, *engines, **changes) as r:
        gw = r.gw
        endpoints = Endpoints(lambda: gw.pool.engines, fake_resolve)
        server = PickerServer(gw.services, LOOPBACK, 0, gw.ready, endpoints=endpoints)
        await server.start()
        try:
            async with channel_to(f"{LOOPBACK}:{server.port}") as ch:
                yield Picking(r, server, ch)
        finally:
            await server.stop(0)
