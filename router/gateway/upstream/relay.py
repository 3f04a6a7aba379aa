"""How an engine's answer reaches the client: the response classes and the non-streamed relay.

An event stream goes out event by event (router.gateway.exchange relays it, in an
``EventStream``). A non-streamed answer is held while small: until the client has a byte, a
failure can still be retried on another engine. Holding a large one is what the gateway cannot
afford: four 200 MB answers held whole, then copied into a response, took 2 GB. So an answer
is held up to ``HOLD_BYTES`` and only while the gateway-wide ``HoldBudget`` covers it; beyond
that it goes to the client as it arrives (the head with the engine's Content-Length, then each
chunk), in memory bounded by the upstream's read-ahead. Once the client has bytes a failure
cannot be retried: the client's connection is cut, which a client sees as a short read, never
as a whole answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from router.gateway.openai.errors import ShuttingDown, UpstreamError
from router.gateway.openai.sse import DONE
from router.gateway.upstream.client import UpstreamResponse
from router.gateway.upstream.headers import UsageTail, client_headers

# An answer up to this size is held until its end (a failure is retried elsewhere).
HOLD_BYTES = 1024 * 1024
# Bytes held by all answers at once, per process: beyond it answers are passed through.
HOLD_BUDGET_BYTES = 64 * 1024 * 1024


class HoldBudget:
    """The bytes that answers being held may take together."""

    __slots__ = ("held", "total")

    def __init__(self, total: int = HOLD_BUDGET_BYTES) -> None:
        self.total = total
        self.held = 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (nothing reserved) when the budget cannot cover them."""
        if self.held + n > self.total:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


@dataclass(slots=True)
class Answer:
    """A non-streamed answer on its way to the client, and how its relay ended."""

    response: web.StreamResponse
    tail: UsageTail  # its last bytes, for the usage it reports
    complete: bool = False  # the engine's whole body was read and sent on
    broken: UpstreamError | None = None  # the engine failed once the client had bytes
    client_gone: bool = False
    stopped: bool = False  # cut short by the gateway's stop (router.gateway.runtime.drain)


async def relay_answer(
    request: web.Request,
    resp: UpstreamResponse,
    first: bytes,
    next_chunk: Callable[[], Awaitable[bytes]],
    budget: HoldBudget,
) -> Answer:
    """Send ``resp``'s body (``first``, then ``next_chunk()`` until b"") to the client.

    Raises ``UpstreamError`` only while the client has no byte (the answer can be retried).
    """
    tail = UsageTail()
    tail.feed(first)
    parts, size = [first], len(first)
    held = HOLD_BYTES if budget.take(HOLD_BYTES) else 0
    try:
        complete = resp.finished()
        while not complete and size <= held:
            chunk = await next_chunk()
            if chunk:
                parts.append(chunk)
                size += len(chunk)
                tail.feed(chunk)
            complete = not chunk or resp.finished()
        if complete:
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            whole = web.Response(
                status=resp.status, body=body, headers=client_headers(resp.headers)
            )
            return Answer(whole, tail, complete=True)
        out = web.StreamResponse(status=resp.status, headers=client_headers(resp.headers))
        length = resp.headers.get("Content-Length", "")
        if length.isdigit():
            out.content_length = int(length)  # a cut answer is then a short read to any client
        answer = Answer(out, tail)
        try:
            await out.prepare(request)
            for part in parts:
                await out.write(part)
        except ConnectionResetError:
            answer.client_gone = True
            return answer
    finally:
        budget.give(held)
    parts.clear()
    return await _pass_on(request, answer, next_chunk)


async def _pass_on(
    request: web.Request, answer: Answer, next_chunk: Callable[[], Awaitable[bytes]]
) -> Answer:
    """The rest of a large answer, chunk by chunk as it arrives."""
    out = answer.response
    try:
        while chunk := await next_chunk():
            answer.tail.feed(chunk)
            await out.write(chunk)
        await out.write_eof()
        answer.complete = True
    except ConnectionResetError:
        answer.client_gone = True
    except (UpstreamError, ShuttingDown) as e:
        if isinstance(e, UpstreamError):
            answer.broken = e
        else:
            answer.stopped = True
        out.force_close()
        if request.transport is not None:
            request.transport.abort()  # no end: the client must not take it for a whole answer
        with contextlib.suppress(ConnectionResetError):
            await out.write_eof()
    return answer


def json_object(body: bytes) -> bool:
    """True when ``body`` is a JSON object (an engine's error in a shape clients parse)."""
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False


def ends_stream(chunk: bytes, at_event: bool) -> bool:
    """True when ``chunk`` ends with OpenAI's last event, ``data: [DONE]``, whole: after a blank
    line in the chunk, or alone in it when the bytes before it ended an event (``at_event``).
    Event data is JSON, which escapes line breaks, so a blank line only ever ends an event."""
    if not chunk.endswith(DONE):
        return False
    before = len(chunk) - len(DONE)
    return chunk.endswith(b"\n\n", 0, before) if before else at_event


class EventStream(web.StreamResponse):
    """A streamed response whose head leaves with its first bytes, in one send.

    aiohttp's ``StreamResponse`` sends its head at ``prepare()``, one more syscall, TCP segment
    and client wake-up per stream than needed; ``web.Response`` holds its head back for the
    body through the class attribute below. It is private to aiohttp, so
    tests/gateway/test_exchange.py pins that a stream's head and first event leave in one write.
    """

    _send_headers_immediately = False
