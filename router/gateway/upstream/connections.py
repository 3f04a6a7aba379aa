"""One keep-alive HTTP/1.1 connection to an engine, and the pool that keeps them.

``Connection`` moves bytes between a socket and router.gateway.upstream.http1's parser, one request
at a time, with back-pressure (reading stops while ``READ_HIGH_WATER_BYTES`` wait unread);
``Pool`` keeps idle connections per engine, newest reused first, and closes those idle longer
than ``KEEPALIVE_SECONDS``. Failures are the lower layer's own: ``WireError`` for bytes that are
no response, ``ConnectionResetError`` for a connection closed under one (the socket's own
``OSError``s pass through); router.gateway.upstream.client, which opens the connections, reads
responses over them and is the only user of this module, maps them to the error tree.
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from aiohappyeyeballs import AddrInfoType

from router.gateway.upstream.http1 import ResponseParser, WireError

# Idle pooled connections are closed after this long: shorter than common engine keep-alive
# timeouts (uvicorn 5 s is the shortest in use), so the engine never closes one under us first.
KEEPALIVE_SECONDS = 4.0

# Body bytes buffered unread before the connection stops reading (the engine then waits): a
# client reading slowly holds back its engine instead of filling the gateway's memory.
READ_HIGH_WATER_BYTES = 256 * 1024


def nodelay_socket(addr_info: AddrInfoType) -> socket.socket:
    """A socket for a connection to an engine, with TCP_NODELAY set whatever the default is."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Connection(asyncio.Protocol):
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

    def __init__(self, pool: Pool, engine: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.engine = engine
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.error: WireError | OSError | None = None
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
            self._fail(WireError("sent bytes outside a response"))
            return
        try:
            p.feed(data)
        except WireError as e:
            self._fail(WireError(f"sent a malformed response: {e}"))
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
                self._fail(WireError(self.closed_message(str(e))))
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        p = self.parser
        if p is not None and not p.complete and self.error is None:
            reason = f"{type(exc).__name__}" if exc is not None else "the connection closed"
            self.error = ConnectionResetError(self.closed_message(reason))
        self.pool.forget(self)
        self._wake()

    # the request's side

    def closed_message(self, reason: str) -> str:
        p = self.parser
        where = "before answering" if p is None or p.headers is None else "while answering"
        return f"closed the connection {where} ({reason})"

    def _fail(self, error: WireError | OSError) -> None:
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
        arrived; raises ``WireError`` or ``OSError``. Engines often send the head on its own
        first: the caller reads the first bytes next anyway, and is woken once instead of twice."""
        p = self.parser
        assert p is not None
        while not (p.body or p.complete):
            if self.error is not None:
                raise self.error
            if self.lost:
                raise ConnectionResetError(self.closed_message("the connection closed"))
            await self.wait()
        return p

    def take(self, parser: ResponseParser) -> bytes | None:
        """The body bytes of ``parser``'s response that have arrived, b"" at its end, None when
        none wait yet (``wait`` for more); raises ``WireError`` or ``OSError``."""
        body = parser.body
        if body:
            data = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
            parser.buffered = 0
            if self.paused and self.transport is not None:
                self.paused = False
                self.transport.resume_reading()
            return data
        if parser.complete:
            return b""
        if self.error is not None:
            raise self.error
        if self.lost or self.parser is not parser:  # closed, or given back to the pool
            raise ConnectionResetError(self.closed_message("the connection closed"))
        return None

    def give_back(self, parser: ResponseParser) -> None:
        """``parser``'s response was read to its end: to the pool when the connection can
        carry another request, else closed."""
        p = parser
        if p.complete and p.reusable and not p.body and self.error is None and not self.lost:
            self.parser = None
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.lost = True


class Pool:
    """Idle keep-alive connections per engine, newest reused first; old ones closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._idle: dict[str, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    def add(self, conn: Connection) -> None:
        self._open.add(conn)

    def take(self, engine: str) -> Connection | None:
        idle = self._idle.get(engine)
        now = self._loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return None

    def put(self, conn: Connection) -> None:
        conn.idle_since = self._loop.time()
        self._idle.setdefault(conn.engine, []).append(conn)
        if self._sweep is None:
            self._sweep = self._loop.call_later(KEEPALIVE_SECONDS, self._close_expired)

    def forget(self, conn: Connection) -> None:
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
