"""The one seam between the gateway and the engines: ``Upstream``.

Everything the gateway sends to an engine (proxied requests, health probes, model lists) goes
through an ``Upstream``. ``HttpUpstream`` is the real one: HTTP/1.1 over pooled keep-alive
connections, TCP_NODELAY on every socket (a streamed token must not wait for Nagle's
algorithm), bytes relayed as the engine sent them (no decompression). Tests swap in
``tests.fakes.FakeUpstream``.

Failures become ``router.gateway.openai.errors`` classes here, in one place: the layers below
(router.gateway.upstream.connections, router.gateway.upstream.http1, the sockets) raise only
``WireError``, ``OSError`` and ``TimeoutError``, and ``upstream_error`` turns each into its
``UpstreamError`` by ``EXCEPTION_MAP``, so nothing above this module knows sockets or HTTP
framing. The one other refusal made here is the client's own: a header that cannot be framed
is a ``BadRequest``, never the engine's failure.

The wire is the gateway's own, in two layers: router.gateway.upstream.http1 frames requests and
responses with no I/O; router.gateway.upstream.connections's ``Connection`` moves bytes between a
socket and a parser, one request at a time, and its ``Pool`` keeps them alive. It is the
gateway's own because aiohttp's client took a quarter to a third of the gateway's CPU per
streamed request (bench/RESULTS.md): a request, a status line and a few chunks need no session,
cookie jar, tracing, redirects or per-request tasks.

Timeouts other than connecting belong to the caller: the exchange knows whether it is waiting
for a first byte or in the middle of a stream.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from aiohappyeyeballs import AddrInfoType
from multidict import MultiMapping

from router.gateway.openai.errors import (
    BadRequest,
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamError,
    UpstreamTimeout,
)
from router.gateway.upstream.connections import Connection, Pool, nodelay_socket
from router.gateway.upstream.http1 import ResponseParser, WireError, request_bytes

# A model list or health answer larger than this is not one; reading stops there.
MAX_FETCH_BYTES = 4 * 1024 * 1024
# An engine's addresses are looked up again after this long (DNS may move an engine).
DNS_TTL_SECONDS = 10.0

# What each lower-layer failure becomes, while connecting (nothing reached the engine) and once
# the request is sent; the first row the exception is an instance of decides (WireError is a
# ValueError, so it comes first).
EXCEPTION_MAP: tuple[tuple[type[Exception], type[UpstreamError], type[UpstreamError]], ...] = (
    # Bytes that are no HTTP/1.1 response, or a response cut short.
    (WireError, UpstreamConnectError, UpstreamDropped),
    # The connect timeout; a fetch's own deadline.
    (TimeoutError, UpstreamConnectError, UpstreamTimeout),
    # Refused, unreachable, unresolvable, TLS refused; reset or closed under a response.
    (OSError, UpstreamConnectError, UpstreamDropped),
    # An engine URL that names no http(s) address.
    (ValueError, UpstreamConnectError, UpstreamDropped),
)
LOWER_ERRORS = tuple(kind for kind, _, _ in EXCEPTION_MAP)


def upstream_error(exc: Exception, engine: str, *, connecting: bool = False) -> UpstreamError:
    """The error tree's class for ``exc``, a lower-layer failure of a call to ``engine``."""
    for kind, before, after in EXCEPTION_MAP:
        if isinstance(exc, kind):
            cls = before if connecting else after
            break
    else:
        raise TypeError(f"{type(exc).__name__} is no lower-layer failure") from exc
    detail = str(exc) or ("timed out" if isinstance(exc, TimeoutError) else type(exc).__name__)
    if connecting:
        return cls(f"cannot connect to {engine}: {detail}", engine)
    return cls(f"{engine} {detail}", engine)


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
            raise ValueError("not an http(s) URL")
        tls = u.scheme == "https"
        port = port or (443 if tls else 80)
        return _Target(u.hostname, port, tls, u.netloc, u.path.rstrip("/"), authorization)


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
        # An engine's own API key (router.gateway.config.engine_keys), on every call to it.
        self._authorization = authorization
        self._targets: dict[str, _Target] = {}
        self._addresses: dict[tuple[str, int], tuple[float, Sequence[AddrInfoType]]] = {}
        self._pool: Pool | None = None
        self._closed = False

    def _target(self, engine: str) -> _Target:
        t = self._targets.get(engine)
        if t is None:
            if len(self._targets) > 4096:  # engines come and go with discovery: stay bounded
                self._targets.clear()
            t = self._targets[engine] = _Target.of(engine, self._authorization(engine))
        return t

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        engine = request.engine
        try:
            target = self._target(engine)
        except ValueError as e:
            raise upstream_error(e, engine, connecting=True) from None
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
            raise BadRequest(str(e)) from None  # the client's header, not the engine's failure
        try:
            conn = await self._connection(engine, target)
        except LOWER_ERRORS as e:
            raise upstream_error(e, engine, connecting=True) from None
        try:
            conn.start(data)
            parser = await conn.head()
        except BaseException as e:
            conn.close()
            if isinstance(e, LOWER_ERRORS):
                raise upstream_error(e, engine) from None
            raise
        return PooledResponse(conn, parser)

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
            error = TimeoutError(f"timed out after {seconds:g}s on {method} {path}")
            raise upstream_error(error, engine) from None
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

    async def _connection(self, engine: str, target: _Target) -> Connection:
        if self._closed:
            raise ConnectionAbortedError("the gateway is closing")
        pool = self._pool
        if pool is None:
            pool = self._pool = Pool(asyncio.get_running_loop())
        conn = pool.take(engine)
        if conn is not None:
            return conn
        async with asyncio.timeout(self._connect_seconds):
            conn = await self._connect(engine, target, pool)
        pool.add(conn)
        return conn

    async def _connect(self, engine: str, target: _Target, pool: Pool) -> Connection:
        loop = asyncio.get_running_loop()
        error: OSError | None = None
        for info in await self._resolve(engine, target):
            sock = nodelay_socket(info)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, info[4])
                tls = self._tls_context() if target.tls else None
                _, conn = await loop.create_connection(
                    lambda: Connection(pool, engine, loop),
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
        raise error or OSError("no address to connect to")

    async def _resolve(self, engine: str, target: _Target) -> Sequence[AddrInfoType]:
        loop = asyncio.get_running_loop()
        key = (target.host, target.port)
        cached = self._addresses.get(key)
        if cached is not None and loop.time() - cached[0] < DNS_TTL_SECONDS:
            return cached[1]
        infos = await loop.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        if len(self._addresses) > 4096:
            self._addresses.clear()
        self._addresses[key] = (loop.time(), infos)
        return infos

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


class PooledResponse:
    """``UpstreamResponse`` over a pooled ``Connection`` whose response head has arrived."""

    __slots__ = ("_conn", "_done", "_parser", "headers", "status")

    def __init__(self, conn: Connection, parser: ResponseParser) -> None:
        self._conn = conn
        self._parser = parser
        self._done = False  # released or aborted: the connection is no longer this response's
        self.status = parser.status
        assert parser.headers is not None
        self.headers: MultiMapping[str] = parser.headers

    async def read_chunk(self) -> bytes:
        conn, p = self._conn, self._parser
        try:
            while (data := conn.take(p)) is None:
                await conn.wait()
        except LOWER_ERRORS as e:
            raise upstream_error(e, conn.engine) from None
        return data

    def finished(self) -> bool:
        p = self._parser
        return p.complete and not p.body

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._conn.give_back(self._parser)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._conn.close()
