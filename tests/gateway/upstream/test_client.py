"""The upstream seam: HTTP/1.1 framing fed in every split, and the client on real loopback
sockets (engine-sim and scripted servers) under asyncio's loop and uvloop."""

from __future__ import annotations

import asyncio
import itertools
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
from hypothesis import given, settings
from hypothesis import strategies as st

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
from router.gateway.upstream.http1 import MAX_HEAD_BYTES, ResponseParser, WireError, request_bytes
from tests.support import LOOPBACK, free_port

CHAT = "/v1/chat/completions"
FAST = SimSettings(fast=True)


# -- framing, no I/O --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    raw: bytes
    status: int
    body: bytes
    reusable: bool
    headers: dict[str, str] = field(default_factory=dict)
    until_close: bool = False  # the body ends when the connection does


SSE_EVENTS = [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', b"data: [DONE]\n\n"]
CHUNKED = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in SSE_EVENTS) + b"0\r\n\r\n"
CASES = {
    "chunked-event-stream": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED,
        200,
        b"".join(SSE_EVENTS),
        True,
        {"Content-Type": "text/event-stream"},
    ),
    "chunk-extensions-trailers-uppercase-hex": Case(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        b"1A;name=value\r\n" + b"z" * 26 + b"\r\n3 ; x\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
        200,
        b"z" * 26 + b"abc",
        True,
    ),
    "content-length": Case(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
        b'{"error":1}',
        503,
        b'{"error":1}',
        True,
        {"X-A": "1"},
    ),
    "content-length-zero-no-reason": Case(
        b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200, b"", True
    ),
    "repeated-equal-content-length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", 200, b"ok", True
    ),
    "connection-close": Case(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok",
        200,
        b"ok",
        False,
    ),
    "http-1.0": Case(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
    "until-close": Case(b"HTTP/1.1 200 OK\r\n\r\nall of it", 200, b"all of it", False, {}, True),
    "unknown-coding-until-close": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw", 200, b"raw", False, {}, True
    ),
    "interim-responses-skipped": Case(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        200,
        b"ok",
        True,
    ),
    "no-content": Case(b"HTTP/1.1 204 No Content\r\nX-B: y\r\n\r\n", 204, b"", True, {"X-B": "y"}),
    "chunked-and-length-read-by-chunks-then-closed": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n",
        200,
        b"ok",
        False,
    ),
    "header-value-spaces-and-utf8": Case(
        b"HTTP/1.1 200 OK\r\nX-Name:  caf\xc3\xa9 \t\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
        200,
        b"",
        True,
        {"X-Name": "café", "X-Empty": ""},
    ),
}


def parse_pieces(pieces: list[bytes], until_close: bool) -> tuple[ResponseParser, bytes]:
    p = ResponseParser()
    body = []
    for piece in pieces:
        p.feed(piece)
        body.extend(p.body)
        p.body.clear()
    if until_close:
        assert not p.complete
        p.eof()
    return p, b"".join(body)


def check(case: Case, pieces: list[bytes]) -> None:
    p, body = parse_pieces(pieces, case.until_close)
    assert p.complete
    assert (p.status, body, p.reusable) == (case.status, case.body, case.reusable)
    assert p.headers is not None
    for k, v in case.headers.items():
        assert p.headers[k] == v


@pytest.mark.parametrize("name", list(CASES))
def test_parser_split_at_every_boundary_same_response(name: str) -> None:
    case = CASES[name]
    raw = case.raw
    check(case, [raw])
    check(case, [raw[i : i + 1] for i in range(len(raw))])
    for cut in range(1, len(raw)):
        check(case, [raw[:cut], raw[cut:]])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(list(CASES)), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_parser_any_pieces_same_response(name: str, cuts: list[int]) -> None:
    case = CASES[name]
    bounds = sorted({0, len(case.raw), *(c % (len(case.raw) + 1) for c in cuts)})
    check(case, [case.raw[a:b] for a, b in itertools.pairwise(bounds)])


def test_parser_body_bytes_available_before_message_ends() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nfirst ha")
    assert p.status == 200 and p.body == [b"first ha"] and not p.complete
    p.body.clear()
    p.feed(b"lf, then\r\n")
    assert p.body == [b"lf, then"] and not p.complete


def test_parser_bytes_after_the_response_not_reusable() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert p.complete and not p.reusable


MALFORMED = {
    "not-http": b"SSH-2.0-OpenSSH\r\n\r\n",
    "http-2-status-line": b"HTTP/2 200\r\n\r\n",
    "status-not-three-digits": b"HTTP/1.1 20 OK\r\n\r\n",
    "header-without-colon": b"HTTP/1.1 200 OK\r\nX-Bad\r\n\r\n",
    "space-in-header-name": b"HTTP/1.1 200 OK\r\nX Bad: 1\r\n\r\n",
    "obsolete-line-folding": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
    "switching-protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    "conflicting-content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nab",
    "negative-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "chunk-size-not-hex": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk-size-signed": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\n",
    "chunk-size-too-long": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"1" * 17
    + b"\r\n",
    "chunk-data-without-crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX",
    "chunk-size-line-endless": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"1;" * 4000,
    "head-endless": b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * MAX_HEAD_BYTES,
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_parser_malformed_wire_error(name: str) -> None:
    raw = MALFORMED[name]
    with pytest.raises(WireError):
        ResponseParser().feed(raw)
    with pytest.raises(WireError):  # the same, one byte at a time
        p = ResponseParser()
        for i in range(len(raw)):
            p.feed(raw[i : i + 1])


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-", "before its head ended"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "in the middle of the body"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", "in the middle"),
    ],
    ids=["in-head", "short-content-length", "no-last-chunk"],
)
def test_parser_eof_before_the_end_wire_error(raw: bytes, where: str) -> None:
    p = ResponseParser()
    p.feed(raw)
    with pytest.raises(WireError, match=where):
        p.eof()


# -- request bytes -----------------------------------------------------------------------------


def test_request_bytes_line_host_headers_length_body() -> None:
    target = upstream_mod._Target.of("http://engine-a:8000/api")
    headers = (("Content-Type", "application/json"), ("X-Name", "café"))
    got = request_bytes("POST", target.base_path + CHAT, target.authority, headers, b'{"a":1}')
    assert got == (
        b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: engine-a:8000\r\n"
        b"Content-Type: application/json\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 7\r\n\r\n"
        b'{"a":1}'
    )
    v6 = upstream_mod._Target.of("http://[::1]:9")
    assert request_bytes("GET", v6.base_path + "/health", v6.authority, (), b"") == (
        b"GET /health HTTP/1.1\r\nHost: [::1]:9\r\n\r\n"
    )


@pytest.mark.parametrize(
    "value", ["a\r\nX-Smuggled: 1", "a\nb", "a\rb", "nul\x00", "bell\x07", "del\x7f"]
)
def test_request_bytes_line_break_or_control_in_header_refused(value: str) -> None:
    with pytest.raises(ValueError, match="control character"):
        request_bytes("POST", CHAT, "e:1", (("X-A", value),), b"{}")
    # A tab is allowed in a field value.
    assert b"X-A: a\tb\r\n" in request_bytes("POST", CHAT, "e:1", (("X-A", "a\tb"),), b"{}")


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
