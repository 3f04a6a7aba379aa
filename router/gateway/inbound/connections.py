"""Client connections: how many may be open, and how long a request's headers may take.

aiohttp's server accepts every connection and waits for a request's headers for as long as its
keep-alive timeout; a client that opens thousands of connections and trickles its headers
(slowloris) holds them all. Its ``web.Server`` is a protocol factory whose protocols are
``web.RequestHandler``s, and ``loop.create_server`` takes any factory, so the gateway listens
with its own: ``ClientConnection``, aiohttp's protocol with three additions.

- The cap: a connection beyond ``limits.max_connections`` is answered 503 and closed at once;
  aiohttp never starts serving it.
- The header deadline: from a connection's opening, and from the first byte of each later
  request, its headers must arrive within ``limits.header_timeout_seconds``, else a 408 and
  the connection closes. ``request_middleware`` tells the connection when aiohttp hands the
  application a request; between requests, an idle connection is closed after
  ``limits.keepalive_timeout_seconds`` (aiohttp's own keep-alive timeout).
- What aiohttp's parser refuses (a bad request line, header or chunk size) is answered in
  OpenAI's shape and logged in one line: aiohttp would answer in plain text, with its
  ``Server`` banner, and log a stack trace for each.

Those three answers are written straight to the transport (``errors.raw_response``): aiohttp
has no request to answer them through. ``Connections`` holds the counts /metrics reads.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError

from router.gateway.config.serving import Limits
from router.gateway.openai.errors import (
    BadRequest,
    GatewayError,
    HeaderTimeout,
    TooManyConnections,
    raw_response,
)

log = logging.getLogger(__name__)

# File descriptors kept for everything but client connections: engines, gossip, files.
FD_RESERVE = 1024
# Reasons of kvrouter_client_connections_rejected_total.
REJECT_REASONS = ("max_connections", "header_timeout")


class Connections:
    """The client connections of this process: the limits, and counts for /metrics."""

    def __init__(self, limits: Limits) -> None:
        self.max_open = limits.max_connections
        self.header_timeout = limits.header_timeout_seconds
        self.keepalive_timeout = limits.keepalive_timeout_seconds
        self.open = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)

    def factory(self, server: web.Server, **handler_args: Any) -> Callable[[], asyncio.Protocol]:
        """Protocols for ``loop.create_server``, serving ``server`` (an ``AppRunner``'s)."""
        loop = asyncio.get_running_loop()

        def connection() -> ClientConnection:
            return ClientConnection(
                server,
                self,
                loop=loop,
                keepalive_timeout=self.keepalive_timeout,
                **handler_args,
            )

        return connection


class _Sent(web.StreamResponse):
    """A response already written to the transport by hand: aiohttp has nothing to send."""

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


def _first_line(message: str, limit: int = 200) -> str:
    line = message.strip().split("\n", 1)[0].strip().rstrip(":")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class ClientConnection(web.RequestHandler):
    """aiohttp's protocol for one client connection, with the cap and the header deadline."""

    def __init__(
        self,
        manager: web.Server,
        connections: Connections,
        *,
        loop: asyncio.AbstractEventLoop,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._connections = connections
        self._event_loop = loop
        self._admitted = False  # counted among the open connections
        self._busy = False  # the application has a request of this connection
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        c = self._connections
        if c.open >= c.max_open:
            c.rejected["max_connections"] += 1
            refusal = TooManyConnections(
                f"the gateway has {c.max_open} connections open, its limit; retry shortly"
            )
            # A write transport whatever the loop (uvloop's is no asyncio.Transport subclass).
            tcp = cast(asyncio.Transport, transport)
            tcp.write(raw_response(refusal))
            tcp.close()
            return
        c.open += 1
        self._admitted = True
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return  # refused: aiohttp never saw it
        self._admitted = False
        self._connections.open -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._busy and self._deadline is None:
            self._arm()  # the first byte of a new request: its headers have until the deadline
        super().data_received(data)

    def request_started(self) -> None:
        """aiohttp handed the application a request: its headers arrived in time."""
        self._busy = True
        self._disarm()

    def request_finished(self) -> None:
        """The application is done with the request (the next one's deadline starts later)."""
        self._busy = False

    def _arm(self) -> None:
        self._disarm()
        timeout = self._connections.header_timeout
        self._deadline = self._event_loop.call_later(timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._busy or self.transport is None:
            return
        self._connections.rejected["header_timeout"] += 1
        timeout = self._connections.header_timeout
        late = HeaderTimeout(f"the request's headers did not arrive within {timeout:g}s")
        self.transport.write(raw_response(late))
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Answer a request aiohttp could not hand the application, in OpenAI's shape."""
        if self.transport is None or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        err: GatewayError
        if isinstance(exc, HttpProcessingError):
            reason = _first_line(exc.message or message or "")
            log.info("malformed request from %s: %s", request.remote, reason)
            err = BadRequest(f"malformed HTTP request: {reason}", code="bad_http_request")
        else:
            # Not the client's doing: keep the stack trace for whoever fixes it.
            log.error("error serving a request from %s", request.remote, exc_info=exc)
            err = GatewayError("internal error")
            err.status = status
        self.transport.write(raw_response(err))
        self.force_close()
        return _Sent()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the request's connection when the application has it (ends its header deadline)."""
    conn = request.protocol
    if not isinstance(conn, ClientConnection):
        return await handler(request)  # served by plain aiohttp (tests)
    conn.request_started()
    try:
        return await handler(request)
    finally:
        conn.request_finished()


async def no_banner(_request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: no ``Server`` header (aiohttp's names its and Python's version)."""
    response.headers.popall("Server", None)


def fit_open_files(connections: int) -> None:
    """Raise this process's open-file limit to hold ``connections`` and ``FD_RESERVE`` more.

    Past the limit, accepting a connection fails before the cap can answer it; where the hard
    limit is lower, say so once.
    """
    need = connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < need:
        log.warning(
            "the open-file limit (%d) is below limits.max_connections + %d (%d): beyond it, "
            "connections fail to be accepted instead of being answered 503",
            target,
            FD_RESERVE,
            need,
        )
