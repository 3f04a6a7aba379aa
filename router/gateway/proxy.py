"""One request's trip through the gateway: route, send, retry, relay, release.

The client's original body bytes go to the engine the routing core picked. Until the client
has received a byte, a failed attempt (connect error, timeout, broken answer, 5xx) moves to the
next-best engine via ``Router.retry``, up to ``limits.max_attempts``; a 4xx is the engine's
verdict on the request and is relayed as is. A streamed answer (``text/event-stream``) is
relayed chunk by chunk as it arrives; once it has started, a failure ends it with an
OpenAI-style error event and a clean close. Any other answer is read whole first (so it can
still be retried, and its ``usage`` read) and sent in one piece.

Requests go only to a backend's base URL (from config or DNS) plus the fixed API path of the
route; nothing in a request (path, query string, headers) chooses where it is sent.

Load taken by ``Router.route`` is given back by ``Router.finish`` in a ``finally``: on success,
error, retry, timeout and client disconnect (aiohttp cancels the handler; the engine's
connection is closed at once, so the engine stops generating too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from router.core.decision import Decision, Router
from router.core.index import Delta
from router.gateway.config import Limits, Timeouts
from router.gateway.engines import BackendPool
from router.gateway.errors import (
    FirstByteTimeout,
    IdleStreamTimeout,
    NoBackend,
    ResponseTooLarge,
    UpstreamError,
    UpstreamStatus,
    stream_error,
)
from router.gateway.inbound import Inbound, session_of
from router.gateway.metrics import Metrics
from router.gateway.relay import UsageTail, body_usage, client_headers, engine_headers
from router.gateway.sse import DONE
from router.gateway.upstream import Upstream, UpstreamRequest, UpstreamResponse

log = logging.getLogger(__name__)

# The last event of an OpenAI stream, as engines frame it.
STREAM_END = DONE.rstrip()

# A non-streamed answer is buffered; embeddings of large batches are the biggest in practice.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 1024 * 1024
# Routes whose prompt tokens feed the cache hit ratio (embeddings have no prefix cache).
GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
CLIENT_GONE = 499


@dataclass(slots=True)
class Outcome:
    """How a proxied request ended, for metrics: the status the client saw."""

    status: int = 0
    # The client has the whole answer (an event stream's [DONE] went out): a disconnect after
    # this point is the client being done, not the client giving up.
    delivered: bool = False


class Proxy:
    """Routes and relays generation requests; owns the retry loop and load release."""

    def __init__(
        self,
        router: Router,
        pool: BackendPool,
        upstream: Upstream,
        metrics: Metrics,
        timeouts: Timeouts,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.pool = pool
        self.upstream = upstream
        self.metrics = metrics
        self.timeouts = timeouts
        self.limits = limits
        self.clock = clock
        # Where index deltas go (gossip plugs in here); by default they stay local.
        self.on_delta: Callable[[Delta], None] = lambda _d: None

    def route(self, inbound: Inbound, headers: Mapping[str, str]) -> Decision:
        """Choose an engine (taking its load); raises ``NotFound`` or ``NoBackend``."""
        candidates = self.pool.candidates(inbound.model)
        s = self.router.policy.scorer("session-affinity")
        session = None if s is None else session_of(inbound, headers, s.header, s.user_field)
        t = time.perf_counter()
        d = self.router.route(inbound.text, candidates, now=self.clock(), session=session)
        self.metrics.decision.observe(time.perf_counter() - t)
        if d.engine is None:
            raise NoBackend("no backend can take the request right now")
        self.metrics.overlap.observe(d.overlap_ratio)
        return d

    async def handle(
        self,
        request: web.Request,
        route: str,
        raw: bytes,
        inbound: Inbound,
        t0: float,
        outcome: Outcome,
    ) -> web.StreamResponse:
        """Route ``inbound`` and relay the chosen engine's answer, retrying before 1st byte."""
        d = self.route(inbound, request.headers)
        try:
            if d.delta is not None:
                self.on_delta(d.delta)
            headers = engine_headers(request.headers, request.remote)
            attempt = 1
            while True:
                engine = d.engine
                assert engine is not None
                try:
                    return await self._attempt(request, route, raw, engine, headers, t0, outcome)
                except UpstreamError as e:
                    self.metrics.backend_request(engine, e.label)
                    self.pool.report_failure(engine, e.message)
                    if attempt >= self.limits.max_attempts:
                        log.warning("%s: attempt %d at %s failed: %s", route, attempt, engine, e)
                        raise
                    if self.router.retry(d, self.clock()) is None:
                        log.warning("%s: %s failed and no backend is left: %s", route, engine, e)
                        raise
                    log.info("%s: %s failed (%s); retrying on %s", route, engine, e, d.engine)
                    self.metrics.retries.inc()
                    attempt += 1
                    if d.delta is not None:
                        self.on_delta(d.delta)
        finally:
            self.router.finish(d)

    async def _attempt(
        self,
        request: web.Request,
        route: str,
        raw: bytes,
        engine: str,
        headers: Sequence[tuple[str, str]],
        t0: float,
        outcome: Outcome,
    ) -> web.StreamResponse:
        """One attempt at ``engine``; raises ``UpstreamError`` while the client has no byte."""
        first_byte = self.timeouts.first_byte_seconds
        resp: UpstreamResponse | None = None
        finished = False  # the body was read to its end: the connection can be reused
        try:
            try:
                async with asyncio.timeout(first_byte):
                    resp = await self.upstream.send(
                        UpstreamRequest(engine, route, tuple(headers), raw)
                    )
                    first = await resp.read_chunk()
            except TimeoutError:
                msg = f"{engine} sent no response within {first_byte:g}s"
                raise FirstByteTimeout(msg, engine) from None
            if resp.status >= 500:
                body = await self._read_rest(resp, engine, first, MAX_ERROR_BODY_BYTES)
                finished = True
                ctype = resp.headers.get("Content-Type", "application/json")
                raise UpstreamStatus(engine, resp.status, body, ctype)
            ctype = resp.headers.get("Content-Type", "")
            if resp.status == 200 and ctype.startswith("text/event-stream") and first:
                out, finished = await self._relay(request, route, resp, engine, first, t0, outcome)
                return out
            body = await self._read_rest(resp, engine, first, MAX_RESPONSE_BYTES)
            finished = True
            self._answered(engine, resp.status)
            if resp.status == 200 and route in GENERATION_ROUTES:
                self._count_usage(body_usage(body))
            return web.Response(status=resp.status, body=body, headers=client_headers(resp.headers))
        finally:
            if resp is not None:
                if finished:
                    resp.release()
                else:
                    resp.abort()

    def _answered(self, engine: str, status: int) -> None:
        self.metrics.backend_request(engine, str(status))
        self.pool.report_success(engine)

    def _count_usage(self, counts: tuple[int, int] | None) -> None:
        if counts is not None:
            self.metrics.usage(*counts)

    async def _read_rest(
        self, resp: UpstreamResponse, engine: str, first: bytes, limit: int
    ) -> bytes:
        """The rest of a body after its first chunk (idle timeout per read)."""
        parts = [first]
        size = len(first)
        chunk = first
        while chunk:
            chunk = await self._next_chunk(resp, engine)
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(f"{engine} answered with more than {limit} bytes")
        return b"".join(parts)

    async def _next_chunk(self, resp: UpstreamResponse, engine: str) -> bytes:
        idle = self.timeouts.idle_stream_seconds
        try:
            async with asyncio.timeout(idle):
                return await resp.read_chunk()
        except TimeoutError:
            raise IdleStreamTimeout(f"{engine} sent nothing for {idle:g}s", engine) from None

    async def _relay(
        self,
        request: web.Request,
        route: str,
        resp: UpstreamResponse,
        engine: str,
        first: bytes,
        t0: float,
        outcome: Outcome,
    ) -> tuple[web.StreamResponse, bool]:
        """Relay an event stream as it arrives; True when the engine's stream ended cleanly.

        Once the client has a byte nothing is retried: an engine failure ends the stream with
        an error event, and a client that left ends the relay (the caller closes the engine's
        connection, which stops its generation).
        """
        out = web.StreamResponse(status=resp.status, headers=client_headers(resp.headers))
        tail = UsageTail()
        tail.feed(first)
        chunk, ttft = first, True
        try:
            await out.prepare(request)  # headers leave with the first bytes, in one send
            try:
                while True:
                    if resp.finished():
                        # The engine is done: the last bytes and the end go out in one send.
                        await out.write_eof(chunk)
                        break
                    await out.write(chunk)
                    if ttft:
                        self.metrics.ttft.observe(self.clock() - t0)
                        ttft = False
                    if chunk.rstrip().endswith(STREAM_END):
                        # The client may hang up the moment it reads this (the openai client
                        # does); the request is answered now, not when the engine closes.
                        self._delivered(route, engine, resp.status, tail, outcome)
                    chunk = await self._next_chunk(resp, engine)
                    if not chunk:
                        with contextlib.suppress(ConnectionResetError):
                            await out.write_eof()
                        break
                    tail.feed(chunk)
            except UpstreamError as e:
                log.warning("%s: stream from %s broke off: %s", route, engine, e)
                self.metrics.backend_request(engine, e.label)
                self.pool.report_failure(engine, e.message)
                outcome.status = e.status
                await out.write_eof(stream_error(e))
                return out, False
        except ConnectionResetError:
            if outcome.delivered:
                return out, False
            log.debug("%s: client left during the stream from %s", route, engine)
            outcome.status = CLIENT_GONE
            return out, False
        if ttft:
            self.metrics.ttft.observe(self.clock() - t0)
        self._delivered(route, engine, resp.status, tail, outcome)
        return out, True

    def _delivered(
        self, route: str, engine: str, status: int, tail: UsageTail, outcome: Outcome
    ) -> None:
        """Count a stream the client has in full (once, whichever end is seen first)."""
        if outcome.delivered:
            return
        outcome.delivered = True
        outcome.status = status
        self._answered(engine, status)
        if route in GENERATION_ROUTES:
            self._count_usage(tail.usage())
