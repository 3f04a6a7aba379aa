"""A small Envoy data plane in Python: it asks the picker, then forwards to the engine named.

What an Envoy with the ext_proc filter and the override-host load balancer does for an
``InferencePool`` route, reduced to what the tests need: each request is one ext_proc stream
(``ExtProcFilter``); an immediate response is the client's answer; otherwise the request
(headers and body as the picker left them) goes to the first endpoint of the picker's list
that accepts a connection, the next ones being the fallbacks (Envoy's override_host policy
walks the list on retries), and the endpoint that served is reported back with the response
headers. The response passes through the picker's response phase on its way to the client.
A client that goes away resets the ext_proc stream, as Envoy's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from router.hostport import LOOPBACK, free_port
from tests.gateway.extproc.envoy_standin import (
    BUFFERED,
    ExtProcFilter,
    FilterConfig,
    channel_to,
)

_NOT_FORWARDED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)
_NOT_RETURNED = frozenset({"content-length", "transfer-encoding", "connection", "date", "server"})


class DataPlane:
    """``url`` takes OpenAI requests and routes them on the picker's word."""

    def __init__(self, picker: str | Sequence[str], config: FilterConfig | None = None) -> None:
        # Several pickers (replicas behind one Service) take the streams in turns.
        self.pickers = [picker] if isinstance(picker, str) else list(picker)
        self.config = config or FilterConfig()
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.served: list[str] = []  # the endpoint of every request forwarded, in order
        self._turns = itertools.count()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[DataPlane]:
        async with contextlib.AsyncExitStack() as stack:
            self._channels = [await stack.enter_async_context(channel_to(p)) for p in self.pickers]
            self._http = await stack.enter_async_context(aiohttp.ClientSession())
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, LOOPBACK, self.port)
            await site.start()
            try:
                yield self
            finally:
                await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        f = ExtProcFilter(self._channels[next(self._turns) % len(self._channels)], self.config)
        try:
            return await self._route(request, f, body)
        except asyncio.CancelledError:
            f.reset()
            raise

    async def _route(
        self, request: web.Request, f: ExtProcFilter, body: bytes
    ) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        routed = await f.request(request.method, request.path_qs, headers, body)
        if routed.immediate is not None:
            im = routed.immediate
            out = {h.header.key: h.header.raw_value.decode() for h in im.headers.set_headers}
            await f.close()
            return web.Response(status=im.status.code, body=im.body, headers=out)
        send = {k: v for k, v in routed.headers.items() if not k.startswith(":")}
        send = {k: v for k, v in send.items() if k not in _NOT_FORWARDED}
        for endpoint in routed.endpoints:
            try:
                upstream = await self._http.request(
                    request.method, f"http://{endpoint}{request.path_qs}", headers=send,
                    data=routed.body,
                )  # fmt: skip
            except aiohttp.ClientConnectionError:
                continue  # the next endpoint of the list, as Envoy's retry would
            break
        else:
            f.reset()
            return web.Response(status=503, text="no healthy upstream")
        self.served.append(endpoint)
        async with upstream:
            return await self._relay(request, f, upstream, endpoint)

    async def _relay(
        self,
        request: web.Request,
        f: ExtProcFilter,
        upstream: aiohttp.ClientResponse,
        endpoint: str,
    ) -> web.StreamResponse:
        back = {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_RETURNED}
        await f.respond_headers(upstream.status, back, endpoint, has_body=True)
        resp = web.StreamResponse(status=upstream.status, headers=back)
        await resp.prepare(request)
        if self.config.response_body_mode == BUFFERED:
            await resp.write(await f.respond_chunk(await upstream.read(), True))
        else:
            async for chunk in upstream.content.iter_any():
                await resp.write(await f.respond_chunk(chunk, False))
            await resp.write(await f.respond_chunk(b"", True))
        await f.respond_trailers()
        await f.close()
        await resp.write_eof()
        return resp
