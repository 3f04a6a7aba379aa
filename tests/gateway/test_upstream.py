"""``AiohttpUpstream`` against a real engine on loopback: relay, error mapping, TCP_NODELAY."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import aiohttp
import pytest
from aiohappyeyeballs import AddrInfoType

from router.enginesim.app import serving
from router.enginesim.engine import SimSettings
from router.gateway import upstream as upstream_mod
from router.gateway.errors import UpstreamConnectError, UpstreamDropped, UpstreamTimeout
from router.gateway.upstream import AiohttpUpstream, UpstreamRequest, nodelay_socket
from tests.support import LOOPBACK, free_port

CHAT = "/v1/chat/completions"
FAST = SimSettings(fast=True)


def body(stream: bool = False) -> bytes:
    return json.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()


def request(url: str, stream: bool = False) -> UpstreamRequest:
    return UpstreamRequest(url, CHAT, (("Content-Type", "application/json"),), body(stream))


async def read_all(resp: upstream_mod.UpstreamResponse) -> bytes:
    parts = []
    for _ in range(10_000):
        chunk = await resp.read_chunk()
        if not chunk:
            break
        parts.append(chunk)
    return b"".join(parts)


def test_nodelay_socket_sets_tcp_nodelay() -> None:
    info = socket.getaddrinfo(LOOPBACK, 80, type=socket.SOCK_STREAM)[0]
    with nodelay_socket(info) as s:
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


@pytest.fixture
def recorded_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []

    def record(info: AddrInfoType) -> socket.socket:
        s = nodelay_socket(info)
        made.append(s)
        return s

    monkeypatch.setattr(upstream_mod, "nodelay_socket", record)
    yield made


async def test_upstream_stream_relay_pooled_nodelay_connection(
    recorded_sockets: list[socket.socket],
) -> None:
    async with serving(FAST) as url:
        up = AiohttpUpstream(connect_seconds=2)
        try:
            for _ in range(3):
                resp = await up.send(request(url, stream=True))
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                data = await read_all(resp)
                assert data.endswith(b"data: [DONE]\n\n")
                resp.release()
            # Keep-alive: three requests, one connection, and TCP_NODELAY on it.
            assert len(recorded_sockets) == 1
            s = recorded_sockets[0]
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        finally:
            await up.close()


async def test_upstream_connection_refused_connect_error() -> None:
    up = AiohttpUpstream(connect_seconds=2)
    url = f"http://{LOOPBACK}:{free_port()}"
    try:
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await up.send(request(url))
        with pytest.raises(UpstreamConnectError):
            await up.fetch(url + "/health", 1)
    finally:
        await up.close()


async def test_upstream_drop_mid_stream_dropped_error() -> None:
    async with serving(FAST) as url, aiohttp.ClientSession() as http:
        await http.post(f"{url}/fault", json={"mode": "drop-mid-stream"})
        up = AiohttpUpstream(connect_seconds=2)
        try:
            resp = await up.send(request(url, stream=True))
            with pytest.raises(UpstreamDropped):
                await read_all(resp)
            resp.abort()
        finally:
            await up.close()


async def test_upstream_fetch_no_answer_times_out() -> None:
    # A listening socket that never accepts: the connection opens, no answer ever comes.
    with socket.socket() as silent:
        silent.bind((LOOPBACK, 0))
        silent.listen(8)
        url = f"http://{LOOPBACK}:{silent.getsockname()[1]}"
        up = AiohttpUpstream(connect_seconds=2)
        try:
            with pytest.raises(UpstreamTimeout, match=r"timed out after 0\.1s"):
                await up.fetch(url + "/health", 0.1)
        finally:
            await up.close()


async def test_upstream_fetch_models_and_health() -> None:
    async with serving(FAST) as url:
        up = AiohttpUpstream(connect_seconds=2)
        try:
            status, raw = await up.fetch(url + "/v1/models", 2)
            assert status == 200 and b"sim-model" in raw
            assert (await up.fetch(url + "/health", 2))[0] == 200
        finally:
            await up.close()
