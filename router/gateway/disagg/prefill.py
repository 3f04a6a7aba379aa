"""The prefill request of a split, and what a split needs of its exchange.

``Prefill.run`` sends one prefill request under the attempt's usual limits (the first-byte
timeout for the whole answer, then the idle timeout per read, the gateway's stop cutting the
wait: router.gateway.upstream.deadline) and reads the answer whole, keeping at most
``KEEP_BYTES`` of it (a prefill engine's answer is one token). A 5xx is an ``UpstreamStatus``,
as for any attempt; a 200 records the request's blocks on the prefill engine (it holds the
prefix now) and publishes the delta; a 200 or a 4xx counts as the engine answering. A client
that leaves, or a prefill that times out, closes the connection and, for an engine that takes
one, posts its abort (router.gateway.upstream.abort); ``quiet`` says the pair is done, so a
prefill cut short then is no loss and gets no abort.

``Exchanging`` is the exchange (router.gateway.exchange) as a split drives it: its attempts,
its counting of failures and answers, and its retry budget, used as they are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from router.core.decision import Lease
from router.core.verdict import Decision
from router.gateway.openai.errors import (
    EngineRefused,
    FirstByteTimeout,
    UpstreamError,
    UpstreamStatus,
)
from router.gateway.receipt import Receipt
from router.gateway.tracing.tracer import RequestTrace
from router.gateway.upstream import relay
from router.gateway.upstream.client import Upstream, UpstreamRequest, UpstreamResponse
from router.gateway.upstream.deadline import Deadline
from router.gateway.wiring import Services

log = logging.getLogger(__name__)

# Of a prefill engine's answer, what is kept (the rest is read and dropped).
KEEP_BYTES = 1024 * 1024
Suspects = list[tuple[str, UpstreamError]]


class Exchanging(Protocol):
    """The exchange as a split drives it (router.gateway.exchange's ``Exchange``)."""

    s: Services
    id: str
    route: str
    receipt: Receipt
    trace: RequestTrace

    async def _attempts(
        self,
        d: Decision,
        plan: Sequence[str],
        raw: bytes,
        headers: Sequence[tuple[str, str]],
        suspects: Suspects,
        *,
        prefills: bool = True,
        upstream: Upstream | None = None,
    ) -> web.StreamResponse: ...

    async def _attempt(
        self,
        lease: Lease,
        raw: bytes,
        headers: Sequence[tuple[str, str]],
        upstream: Upstream | None = None,
    ) -> web.StreamResponse: ...

    async def _before_retry(self, attempt: int, engine: str) -> None: ...

    def _failed(self, engine: str, error: UpstreamError, *, blame: bool = True) -> None: ...

    def _blame(self, suspects: Suspects) -> None: ...

    def _answered(self, engine: str, status: int) -> None: ...

    def _refused(self, resp: UpstreamResponse, whole: bytes) -> web.Response: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """A prefill engine's whole answer (its status 200 or 4xx)."""

    resp: UpstreamResponse  # released: its status and headers, for a refusal
    body: bytes

    @property
    def status(self) -> int:
        return self.resp.status


def refusal(ex: Exchanging, answer: Answer) -> web.Response:
    """A prefill engine's 4xx as the client gets it: the engine's verdict on the request."""
    if not relay.is_json_object(answer.body):
        raise EngineRefused(answer.status)
    return ex._refused(answer.resp, answer.body)


class Prefill:
    """One prefill request of a split (``run``, once)."""

    def __init__(self, ex: Exchanging) -> None:
        self.ex = ex
        self.quiet = False  # the pair is done: cut short now, the prefill needs no abort

    async def run(self, lease: Lease, body: bytes, headers: Sequence[tuple[str, str]]) -> Answer:
        """Send ``body`` to ``lease.engine`` and read its answer; raises ``UpstreamError``."""
        ex = self.ex
        s, engine = ex.s, lease.engine
        first_byte = s.timeouts.first_byte_seconds
        idle = s.timeouts.idle_stream_seconds
        payload, rid = s.aborts.tag(engine, ex.route, body, ex.id)
        resp: UpstreamResponse | None = None
        finished = False
        deadline = Deadline(min(first_byte, idle))
        s.drain.watch(deadline)
        try:
            deadline.start(first_byte)
            request = UpstreamRequest(engine, ex.route, tuple(headers), payload)
            resp, first = await relay.first_bytes(
                s.upstream, request, deadline, first_byte, "prefill answer"
            )
            whole = await _read(relay.Body(resp, engine, deadline, idle), first)
            finished = True
            if resp.status >= 500:
                ctype = resp.headers.get("Content-Type", "application/json")
                raise UpstreamStatus(engine, resp.status, whole, ctype)
            if resp.status == 200:
                delta = s.core.record(lease, s.clock())
                if delta is not None:
                    s.publish(delta)
            ex._answered(engine, resp.status)
            return Answer(resp, whole)
        except (asyncio.CancelledError, FirstByteTimeout):
            if rid is not None and not finished and not self.quiet:
                s.aborts.send(engine, rid)
            raise
        finally:
            deadline.close()
            s.drain.forget(deadline)
            if resp is not None:
                if finished:
                    resp.release()
                else:
                    resp.abort()


async def _read(body: relay.Body, first: bytes) -> bytes:
    """The answer's bytes to its end, keeping the first ``KEEP_BYTES``."""
    parts, size, chunk = [first], len(first), first
    while chunk and not body.resp.finished():
        chunk = await body.next()
        if size < KEEP_BYTES:
            parts.append(chunk)
            size += len(chunk)
    return b"".join(parts)
