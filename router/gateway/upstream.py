"""The one seam between the gateway and the engines: ``Upstream``.

Everything the gateway sends to an engine (proxied requests, health probes, model lists) goes
through an ``Upstream``. ``HttpUpstream`` is the real one: HTTP/1.1 over pooled keep-alive
connections, TCP_NODELAY on every socket (a streamed token must not wait for Nagle's
algorithm), bytes relayed as the engine sent them (no decompression). Tests swap in
``tests.fakes.FakeUpstream``. Failures become ``router.gateway.errors`` classes here, in one
place, so nothing above this module knows sockets or HTTP framing.

The wire is the gateway's own, in two layers: router.gateway.http1 frames requests and
responses with no I/O; ``_Connection`` moves bytes between a socket and a parser, one request
at a time. aiohttp's client did this job before and took a quarter to a third of the
gateway's CPU per streamed request (bench/RESULTS.md): a request, a status line and a few
chunks need no session, cookie jar, tracing, redirects or per-request tasks.

Timeouts other than connecting belong to the caller: the proxy knows whether it is waiting
for a first byte or in the middle of a stream.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

from aiohappyeyeballs import AddrInfoType
from multidict import MultiMapping

from router.gateway.errors import (
    BadRequest,
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamError,
    UpstreamTimeout,
)
from router.gateway.http1 import ResponseParser, WireError, request_bytes

# A model list or health answer larger than this is not one; reading stops there.
MAX_FETCH_BYTES = 4 * 1024 * 1024
# Idle pooled connections are closed after this long: shorter than common engine keep-alive
# timeouts (uvicorn 5 s is the shortest in use), so the engine never closes one under us first.
KEEPALIVE_SECONDS = 4.0
# An engine's addresses are looked up again after this long (DNS may move an engine).
DNS_TTL_SECONDS = 10.0
# Body bytes buffered unread before the connection stops reading (the engine then waits): a
# client reading slowly holds back its engine instead of filling the gateway's memory.
READ_HIGH_WATER_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """A request to one engine: its base URL, a fixed API path, headers and the body bytes."""

    engine: str
    path: str
    headers: Sequence[tuple[str, str]]
    body: bytes
    method: str = "POST"


class UpstreamResponse(Protocol):
    """An engine's response whose status and headers have arrived; the body is read on demand."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> MultiMapping[str]: ...

    async def read_chunk(self) -> bytes:
        """The body bytes that have arrived (all of them, at least one), b"" at the end;
        raises ``UpstreamDropped``."""
        ...

    def finished(self) -> bool:
        """True when the whole body has arrived and been read: no chunk is left to come."""
        ...

    def release(self) -> None:
        """The body was read to its end: the connection goes back to the pool."""
        ...

    def abort(self) -> None:
        """Stop now: close the connection, so the engine sees the request go away."""
        ...


class Upstream(Protocol):
    """How the gateway talks to engines."""

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send ``request``; return when status, headers and the first body bytes (or the
        end) arrived; raises ``UpstreamError``."""
        ...

    async def fetch(
        self,
        engine: str,
        path: str,
        seconds: float,
        body: bytes | None = None,
        limit: int = MAX_FETCH_BYTES,
    ) -> tuple[int, bytes]:
        """GET ``path`` of ``engine`` (a probe, a model list, its metrics), or POST ``body``
        (JSON) to it, within ``seconds``; at most ``limit`` bytes of the answer are read.
        Raises ``UpstreamError``."""
        ...

    async def close(self) -> None:
        """Close every pooled connection."""
        ...


def nodelay_socket(addr_info: AddrInfoType) -> socket.socket:
    """A socket for a connection to an engine, with TCP_NODELAY set whatever the default is."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@dataclass(frozen=True, slots=True)
class _Target:
    """Where an engine's base URL points: what to connect to and how requests name it."""

    host: str  # for DNS and TLS (no brackets around IPv6)
    port: int
    tls: bool
    authority: str  # the Host header
    base_path: str  # prefixed to every request path
    authorization: str | None  # the engine's own key, replacing any the request carries

    @staticmethod
    def of(engine: str, authorization: str | None = None) -> _Target:
        u = urlsplit(engine)
        try:
            port = u.port
        except ValueError:
            port = None
            u = u._replace(scheme="")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UpstreamConnectError(f"cannot connect to {engine}: not an http(s) URL", engine)
        tls = u.scheme == "https"
        port = port or (443 if tls else 80)
        return _Target(u.hostname, port, tls, u.netloc, u.path.rstrip("/"), authorization)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one request at a time."""

    __slots__ = (
        "engine",
        "error",
        "idle_since",
        "loop",
        "lost",
        "parser",
        "paused",
        "pool",
        "transport",
        "waiter",
    )

    def __init__(self, pool: _Pool, engine: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.engine = engine
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.error: UpstreamError | None = None
        self.lost = False
        self.paused = False
        self.idle_since = 0.0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's do not subclass asyncio.Transport, hence the cast).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        p = self.parser
        if p is None or self.error is not None:
            # Bytes nobody asked for (an idle connection, or after a failure): unusable.
            self._fail(UpstreamDropped(f"{self.engine} sent bytes outside a response", self.engine))
            return
        try:
            p.feed(data)
        except WireError as e:
            self._fail(
                UpstreamDropped(f"{self.engine} sent a malformed response: {e}", self.engine)
            )
            return
        if p.buffered > READ_HIGH_WATER_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if p.body or p.complete:  # a head alone wakes nobody: the body's first bytes follow
            self._wake()

    def eof_received(self) -> bool:
        p = self.parser
        if p is not None and self.error is None:
            try:
                p.eof()
            except WireError as e:
                self._fail(UpstreamDropped(self._closed_message(str(e)), self.engine))
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        p = self.parser
        if p is not None and not p.complete and self.error is None:
            reason = f"{type(exc).__name__}" if exc is not None else "the connection closed"
            self.error = UpstreamDropped(self._closed_message(reason), self.engine)
        self.pool.forget(self)
        self._wake()

    # the request's side

    def _closed_message(self, reason: str) -> str:
        p = self.parser
        where = "before answering" if p is None or p.headers is None else "while answering"
        return f"{self.engine} closed the connection {where} ({reason})"

    def _fail(self, error: UpstreamError) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until the parser or the connection's state changes."""
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def usable(self, now: float) -> bool:
        """Idle, open and not about to be closed by the engine's keep-alive timeout."""
        t = self.transport
        return (
            not self.lost
            and t is not None
            and not t.is_closing()
            and now - self.idle_since < KEEPALIVE_SECONDS
        )

    def start(self, data: bytes) -> None:
        """Send one request's bytes; the response is read into a fresh parser."""
        assert self.transport is not None
        self.parser = ResponseParser()
        self.error = None
        self.transport.write(data)

    async def head(self) -> ResponseParser:
        """The parser once the response's head and its first body bytes (or its end) have
        arrived; raises ``UpstreamError``. Engines often send the head on its own first: the
        caller reads the first bytes next anyway, and is woken once instead of twice."""
        p = self.parser
        assert p is not None
        while not (p.body or p.complete):
            if self.error is not None:
                raise self.error
            if self.lost:
                raise UpstreamDropped(self._closed_message("the connection closed"), self.engine)
            await self.wait()
        return p

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.lost = True


class _Response:
    """``UpstreamResponse`` over a ``_Connection`` whose response head has arrived."""

    __slots__ = ("_conn", "_done", "_parser", "headers", "status")

    def __init__(self, conn: _Connection, parser: ResponseParser) -> None:
        self._conn = conn
        self._parser = parser
        self._done = False  # released or aborted: the connection is no longer this response's
        self.status = parser.status
        assert parser.headers is not None
        self.headers: MultiMapping[str] = parser.headers

    async def read_chunk(self) -> bytes:
        p, conn = self._parser, self._conn
        while True:
            body = p.body
            if body:
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                p.buffered = 0
                if conn.paused and conn.transport is not None:
                    conn.paused = False
                    conn.transport.resume_reading()
                return data
            if p.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            if conn.lost or self._done:
                raise UpstreamDropped(conn._closed_message("the connection closed"), conn.engine)
            await conn.wait()

    def finished(self) -> bool:
        p = self._parser
        return p.complete and not p.body

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        conn, p = self._conn, self._parser
        if p.complete and p.reusable and not p.body and conn.error is None and not conn.lost:
            conn.parser = None
            conn.pool.put(conn)
        else:
            conn.close()

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._conn.close()


class _Pool:
    """Idle keep-alive connections per engine, newest reused first; old ones closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._idle: dict[str, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    def add(self, conn: _Connection) -> None:
        self._open.add(conn)

    def take(self, engine: str) -> _Connection | None:
        idle = self._idle.get(engine)
        now = self._loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return None

    def put(self, conn: _Connection) -> None:
        conn.idle_since = self._loop.time()
        self._idle.setdefault(conn.engine, []).append(conn)
        if self._sweep is None:
            self._sweep = self._loop.call_later(KEEPALIVE_SECONDS, self._close_expired)

    def forget(self, conn: _Connection) -> None:
        """``conn`` closed: it is neither open nor idle any more."""
        self._open.discard(conn)
        idle = self._idle.get(conn.engine)
        if idle and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[conn.engine]

    def _close_expired(self) -> None:
        self._sweep = None
        now = self._loop.time()
        for engine, idle in list(self._idle.items()):
            for conn in [c for c in idle if not c.usable(now)]:
                idle.remove(conn)
                conn.close()
            if not idle:
                del self._idle[engine]
        if self._idle:
            self._sweep = self._loop.call_later(KEEPALIVE_SECONDS, self._close_expired)

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()


class HttpUpstream:
    """``Upstream`` over this module's HTTP/1.1 client with pooled keep-alive connections."""

    def __init__(
        self,
        connect_seconds: float,
        tls: ssl.SSLContext | None = None,
        authorization: Callable[[str], str | None] = lambda _engine: None,
    ) -> None:
        self._connect_seconds = connect_seconds
        self._tls = tls
        # An engine's own API key (router.gateway.engine_keys), on every call to it.
        self._authorization = authorization
        self._targets: dict[str, _Target] = {}
        self._addresses: dict[tuple[str, int], tuple[float, Sequence[AddrInfoType]]] = {}
        self._pool: _Pool | None = None
        self._closed = False

    def _target(self, engine: str) -> _Target:
        t = self._targets.get(engine)
        if t is None:
            if len(self._targets) > 4096:  # engines come and go with discovery: stay bounded
                self._targets.clear()
            t = self._targets[engine] = _Target.of(engine, self._authorization(engine))
        return t

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        target = self._target(request.engine)
        headers = request.headers
        if target.authorization is not None:
            headers = [h for h in headers if h[0].lower() != "authorization"]
            headers.append(("Authorization", target.authorization))
        try:
            data = request_bytes(
                request.method,
                target.base_path + request.path,
                target.authority,
                headers,
                request.body,
            )
        except ValueError as e:
            raise BadRequest(str(e)) from None
        conn = await self._connection(request.engine, target)
        try:
            conn.start(data)
            parser = await conn.head()
        except BaseException:
            conn.close()
            raise
        return _Response(conn, parser)

    async def fetch(
        self,
        engine: str,
        path: str,
        seconds: float,
        body: bytes | None = None,
        limit: int = MAX_FETCH_BYTES,
    ) -> tuple[int, bytes]:
        headers: tuple[tuple[str, str], ...] = (("Accept-Encoding", "identity"),)
        method = "GET" if body is None else "POST"
        if body is not None:
            headers += (("Content-Type", "application/json"),)
        resp: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(seconds):
                request = UpstreamRequest(engine, path, headers, body or b"", method)
                resp = await self.send(request)
                parts: list[bytes] = []
                size = 0
                while size < limit and (chunk := await resp.read_chunk()):
                    parts.append(chunk)
                    size += len(chunk)
                return resp.status, b"".join(parts)[:limit]
        except TimeoutError:
            raise UpstreamTimeout(
                f"{method} {engine}{path} timed out after {seconds:g}s", engine
            ) from None
        finally:
            if resp is not None:
                if resp.finished():
                    resp.release()
                else:
                    resp.abort()

    async def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.close()

    async def _connection(self, engine: str, target: _Target) -> _Connection:
        if self._closed:
            raise UpstreamConnectError(
                f"cannot connect to {engine}: the gateway is closing", engine
            )
        pool = self._pool
        if pool is None:
            pool = self._pool = _Pool(asyncio.get_running_loop())
        conn = pool.take(engine)
        if conn is not None:
            return conn
        try:
            async with asyncio.timeout(self._connect_seconds):
                conn = await self._connect(engine, target, pool)
        except TimeoutError:
            raise UpstreamConnectError(f"connecting to {engine} timed out", engine) from None
        pool.add(conn)
        return conn

    async def _connect(self, engine: str, target: _Target, pool: _Pool) -> _Connection:
        loop = asyncio.get_running_loop()
        error: OSError | None = None
        for info in await self._resolve(engine, target):
            sock = nodelay_socket(info)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, info[4])
                tls = self._tls_context() if target.tls else None
                _, conn = await loop.create_connection(
                    lambda: _Connection(pool, engine, loop),
                    sock=sock,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
                return conn
            except OSError as e:
                sock.close()
                error = e
            except BaseException:
                sock.close()
                raise
        raise UpstreamConnectError(f"cannot connect to {engine}: {error}", engine)

    async def _resolve(self, engine: str, target: _Target) -> Sequence[AddrInfoType]:
        loop = asyncio.get_running_loop()
        key = (target.host, target.port)
        cached = self._addresses.get(key)
        if cached is not None and loop.time() - cached[0] < DNS_TTL_SECONDS:
            return cached[1]
        try:
            infos = await loop.getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except OSError as e:
            raise UpstreamConnectError(f"cannot connect to {engine}: {e}", engine) from e
        if len(self._addresses) > 4096:
            self._addresses.clear()
        self._addresses[key] = (loop.time(), infos)
        return infos

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
