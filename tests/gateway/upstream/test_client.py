"""The engine client on real loopback sockets (engine-sim and scripted servers), under
asyncio's loop and uvloop: streams, pooled keep-alive connections, failures, TLS."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohappyeyeballs import AddrInfoType
from aiohttp import web

from router.enginesim.app import serving
from router.enginesim.engine import SimSettings
from router.gateway.openai.errors import (
    BadRequest,
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamTimeout,
)
from router.gateway.upstream import client as upstream_mod
from router.gateway.upstream.client import HttpUpstream, UpstreamRequest, UpstreamResponse
from router.gateway.upstream.connections import READ_HIGH_WATER_BYTES, nodelay_socket
from tests.support import LOOPBACK, free_port

CHAT = "/v1/chat/completions"
FAST = SimSettings(fast=True)


# -- on loopback -----------------------------------------------------------------------------


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    uvloop = pytest.importorskip("uvloop")
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[None]], None]:
    """Run a scenario on asyncio's own loop, then on uvloop's (what the gateway runs on)."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else _uvloop_factory()

    def go(scenario: Awaitable[None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(scenario, 20))

    return go


def body(stream: bool = False) -> bytes:
    return json.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()


def request(url: str, stream: bool = False) -> UpstreamRequest:
    return UpstreamRequest(url, CHAT, (("Content-Type", "application/json"),), body(stream))


async def read_all(resp: UpstreamResponse) -> bytes:
    parts = []
    for _ in range(10_000):
        chunk = await resp.read_chunk()
        if not chunk:
            break
        parts.append(chunk)
    return b"".join(parts)


@asynccontextmanager
async def upstream(**kw: object) -> AsyncIterator[HttpUpstream]:
    up = HttpUpstream(connect_seconds=2, **kw)  # type: ignore[arg-type]
    try:
        yield up
    finally:
        await up.close()


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


def test_upstream_stream_relay_pooled_nodelay_connection(
    run: Callable[[Awaitable[None]], None], recorded_sockets: list[socket.socket]
) -> None:
    async def scenario() -> None:
        async with serving(FAST) as url, upstream() as up:
            for _ in range(3):
                resp = await up.send(request(url, stream=True))
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                data = await read_all(resp)
                assert data.endswith(b"data: [DONE]\n\n")
                assert resp.finished()
                resp.release()
            status, raw = await up.fetch(url, "/v1/models", 2)
            assert status == 200 and b"sim-model" in raw
            # Keep-alive: three requests and a fetch, one connection, TCP_NODELAY on it.
            assert len(recorded_sockets) == 1
            s = recorded_sockets[0]
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1

    run(scenario())


def test_upstream_connection_refused_connect_error(run: Callable[[Awaitable[None]], None]) -> None:
    async def scenario() -> None:
        url = f"http://{LOOPBACK}:{free_port()}"
        async with upstream() as up:
            with pytest.raises(UpstreamConnectError, match="cannot connect"):
                await up.send(request(url))
            with pytest.raises(UpstreamConnectError):
                await up.fetch(url, "/health", 1)

    run(scenario())


def test_upstream_drop_mid_stream_dropped_error(run: Callable[[Awaitable[None]], None]) -> None:
    async def scenario() -> None:
        async with serving(FAST) as url, aiohttp.ClientSession() as http, upstream() as up:
            await http.post(f"{url}/fault", json={"mode": "drop-mid-stream"})
            resp = await up.send(request(url, stream=True))
            with pytest.raises(UpstreamDropped, match="while answering"):
                await read_all(resp)
            resp.abort()

    run(scenario())


def test_upstream_fetch_no_answer_times_out(run: Callable[[Awaitable[None]], None]) -> None:
    async def scenario() -> None:
        # A listening socket that never accepts: the connection opens, no answer ever comes.
        with socket.socket() as silent:
            silent.bind((LOOPBACK, 0))
            silent.listen(8)
            url = f"http://{LOOPBACK}:{silent.getsockname()[1]}"
            async with upstream() as up:
                with pytest.raises(UpstreamTimeout, match=r"timed out after 0\.1s"):
                    await up.fetch(url, "/health", 0.1)

    run(scenario())


def test_upstream_fetch_health(run: Callable[[Awaitable[None]], None]) -> None:
    async def scenario() -> None:
        async with serving(FAST) as url, upstream() as up:
            assert (await up.fetch(url, "/health", 2))[0] == 200

    run(scenario())


# A scripted engine: each request read gets the next answer (bytes, then close the connection
# or not); the server counts connections and keeps what each request carried.

CLOSE = b""  # as an answer: close the connection without a byte


@dataclass
class Scripted:
    answers: list[tuple[bytes, bool]]
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed_by_peer: asyncio.Event = field(default_factory=asyncio.Event)


async def _serve_connection(
    s: Scripted, reader: asyncio.StreamReader, w: asyncio.StreamWriter
) -> None:
    s.connections += 1
    try:
        while s.answers:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                s.closed_by_peer.set()
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            s.requests.append(head + await reader.readexactly(length))
            answer, close = s.answers.pop(0)
            w.write(answer)
            await w.drain()
            if close:
                return
        if await reader.read(1) == b"":
            s.closed_by_peer.set()
    finally:
        w.close()


@asynccontextmanager
async def scripted(*answers: tuple[bytes, bool]) -> AsyncIterator[Scripted]:
    s = Scripted(list(answers))
    server = await asyncio.start_server(lambda r, w: _serve_connection(s, r, w), LOOPBACK, 0)
    s.url = f"http://{LOOPBACK}:{server.sockets[0].getsockname()[1]}"
    try:
        yield s
    finally:
        server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def until(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_upstream_keep_alive_reused_unless_engine_says_close(
    run: Callable[[Awaitable[None]], None],
) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"

    async def scenario() -> None:
        async with scripted((OK, False), (closing, False), (OK, False)) as s, upstream() as up:
            for _ in range(3):
                resp = await up.send(request(s.url))
                assert (resp.status, await read_all(resp)) == (200, b"ok")
                resp.release()
            assert s.connections == 2  # the second answer said close: a new connection
            assert s.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")

    run(scenario())


def test_upstream_body_until_close_read_whole_connection_not_reused(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def scenario() -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
        async with scripted((answer, True), (OK, False)) as s, upstream() as up:
            resp = await up.send(request(s.url))
            assert await read_all(resp) == b"until the end"
            assert resp.finished()
            resp.release()
            resp = await up.send(request(s.url))
            assert await read_all(resp) == b"ok"
            resp.release()
            assert s.connections == 2

    run(scenario())


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (b"garbage\r\n\r\n", "malformed response"),
        (CLOSE, "closed the connection before answering"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "while answering"),
    ],
    ids=["garbage", "closed-before-answering", "short-body"],
)
def test_upstream_broken_answer_dropped(
    run: Callable[[Awaitable[None]], None], answer: bytes, match: str
) -> None:
    async def scenario() -> None:
        async with scripted((answer, True)) as s, upstream() as up:
            with pytest.raises(UpstreamDropped, match=match):
                resp = await up.send(request(s.url))
                await read_all(resp)

    run(scenario())


def test_upstream_idle_connection_closed_by_engine_not_reused(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def scenario() -> None:
        async with scripted((OK, True), (OK, False)) as s, upstream() as up:
            resp = await up.send(request(s.url))
            assert await read_all(resp) == b"ok"
            resp.release()  # pooled; then the engine closes it (its keep-alive timeout)
            await until(lambda: not up._pool or not up._pool._idle)
            resp = await up.send(request(s.url))
            assert await read_all(resp) == b"ok"
            resp.release()
            assert s.connections == 2

    run(scenario())


def test_upstream_abort_closes_connection_engine_sees_it(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def scenario() -> None:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
        async with scripted((head, False)) as s, upstream() as up:
            resp = await up.send(request(s.url, stream=True))
            assert await resp.read_chunk() == b"first"
            assert not resp.finished()
            resp.abort()
            await asyncio.wait_for(s.closed_by_peer.wait(), 5)
            with pytest.raises(UpstreamDropped):
                await resp.read_chunk()

    run(scenario())


def test_upstream_large_body_past_high_water_arrives_whole(
    run: Callable[[Awaitable[None]], None],
) -> None:
    big = bytes(range(256)) * (4 * READ_HIGH_WATER_BYTES // 256)

    async def scenario() -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
        async with scripted((answer, False)) as s, upstream() as up:
            resp = await up.send(request(s.url))
            await asyncio.sleep(0.05)  # let the engine fill the buffer past the high water
            got = await read_all(resp)
            assert got == big and resp.finished()
            resp.release()

    run(scenario())


def test_upstream_header_with_line_break_refused_before_sending(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def scenario() -> None:
        async with scripted((OK, False)) as s, upstream() as up:
            bad = UpstreamRequest(s.url, CHAT, (("X-A", "1\r\nX-B: 2"),), b"{}")
            with pytest.raises(BadRequest, match="control character"):
                await up.send(bad)
            assert s.connections == 0

    run(scenario())


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_upstream_https_engine_verified(
    run: Callable[[Awaitable[None]], None], tls_files: tuple[Path, Path]
) -> None:
    cert, key = tls_files

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="over tls")

    async def scenario() -> None:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_get("/health", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, LOOPBACK, port, ssl_context=server_ctx).start()
        try:
            url = f"https://localhost:{port}"
            async with upstream() as up:  # the system's CAs: the test certificate is refused
                with pytest.raises(UpstreamConnectError):
                    await up.fetch(url, "/health", 2)
            trusting = ssl.create_default_context(cafile=str(cert))
            async with upstream(tls=trusting) as up:
                assert await up.fetch(url, "/health", 2) == (200, b"over tls")
        finally:
            await runner.cleanup()

    run(scenario())
