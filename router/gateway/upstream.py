"""The one seam between the gateway and the engines: ``Upstream``.

Everything the gateway sends to an engine (proxied requests, health probes, model lists) goes
through an ``Upstream``. ``AiohttpUpstream`` is the real one: one pooled keep-alive
``ClientSession`` for all engines, TCP_NODELAY on every socket (a streamed token must not wait
for Nagle's algorithm), no decompression (bytes are relayed as the engine sent them). Tests swap
in ``tests.fakes.FakeUpstream``. aiohttp's exceptions are mapped to ``router.gateway.errors`` here,
in one place, so nothing above this module knows aiohttp's client.

Timeouts other than connecting belong to the caller: the proxy knows whether it is waiting
for a first byte or in the middle of a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohappyeyeballs import AddrInfoType
from multidict import MultiMapping

from router.gateway.errors import (
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamError,
    UpstreamTimeout,
)

# A model list or health answer larger than this is not one; reading stops there.
MAX_FETCH_BYTES = 4 * 1024 * 1024
# Idle pooled connections are closed after this long: shorter than common engine keep-alive
# timeouts (uvicorn 5 s is the shortest in use), so the engine never closes one under us first.
KEEPALIVE_SECONDS = 4.0


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
        """The next bytes as they arrive, b"" at the end; raises ``UpstreamDropped``."""
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
        """Send ``request``; return when status and headers arrived; raises ``UpstreamError``."""
        ...

    async def fetch(self, url: str, seconds: float) -> tuple[int, bytes]:
        """GET ``url`` (a probe or a model list) within ``seconds``; raises ``UpstreamError``."""
        ...

    async def close(self) -> None:
        """Close every pooled connection."""
        ...


def nodelay_socket(addr_info: AddrInfoType) -> socket.socket:
    """A socket for the connector, with TCP_NODELAY set whatever the library's default is."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@contextlib.contextmanager
def _mapped(engine: str, connecting: bool) -> Iterator[None]:
    """aiohttp client exceptions -> the gateway's ``UpstreamError`` classes."""
    try:
        yield
    except UpstreamError:
        raise
    except aiohttp.ClientConnectorError as e:
        raise UpstreamConnectError(f"cannot connect to {engine}: {e.os_error}", engine) from e
    except (aiohttp.ConnectionTimeoutError, aiohttp.SocketTimeoutError) as e:
        raise UpstreamConnectError(f"connecting to {engine} timed out", engine) from e
    except aiohttp.ClientPayloadError as e:
        raise UpstreamDropped(f"{engine} broke off its response: {e}", engine) from e
    except (aiohttp.ClientError, OSError) as e:
        where = "before answering" if connecting else "while answering"
        what = type(e).__name__
        raise UpstreamDropped(f"{engine} closed the connection {where} ({what})", engine) from e


class _Response:
    __slots__ = ("_engine", "_resp")

    def __init__(self, engine: str, resp: aiohttp.ClientResponse) -> None:
        self._engine = engine
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> MultiMapping[str]:
        return self._resp.headers

    async def read_chunk(self) -> bytes:
        with _mapped(self._engine, connecting=False):
            return await self._resp.content.readany()

    def finished(self) -> bool:
        return self._resp.content.at_eof()

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.close()


class AiohttpUpstream:
    """``Upstream`` over one pooled keep-alive aiohttp ``ClientSession``."""

    def __init__(self, connect_seconds: float) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,  # one connection per in-flight request; a pool cap would queue tokens
            keepalive_timeout=KEEPALIVE_SECONDS,
            socket_factory=nodelay_socket,
            ttl_dns_cache=10,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=connect_seconds, sock_connect=connect_seconds
            ),
            auto_decompress=False,
            # Relayed headers are the client's (filtered); the gateway adds none of its own.
            skip_auto_headers=("User-Agent",),
            raise_for_status=False,
        )

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        url = request.engine + request.path
        with _mapped(request.engine, connecting=True):
            resp = await self._session.request(
                request.method,
                url,
                data=request.body,
                headers=list(request.headers),
                allow_redirects=False,
                compress=None,
            )
        return _Response(request.engine, resp)

    async def fetch(self, url: str, seconds: float) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(seconds):
                with _mapped(url, connecting=True):
                    async with self._session.get(
                        url, allow_redirects=False, headers={"Accept-Encoding": "identity"}
                    ) as resp:
                        body = await resp.content.read(MAX_FETCH_BYTES)
                        return resp.status, body
        except TimeoutError:
            raise UpstreamTimeout(f"GET {url} timed out after {seconds:g}s", url) from None

    async def close(self) -> None:
        await self._session.close()
