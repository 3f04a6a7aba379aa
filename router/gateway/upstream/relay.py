"""How an engine's answer reaches the client: the streamed relay and the held one, side by side.

Both read the engine's body through a ``Body``: each read within the idle timeout, under the
attempt's one ``Deadline`` (router.gateway.upstream.deadline). Both end in an ``Answer`` that
says how the relay ended; the exchange (router.gateway.exchange) settles it
(router.gateway.settle).

An event stream (``stream``) goes out event by event as it arrives, in an ``EventStream``.
Once it has started nothing is retried: a failure leaves the stream open for the exchange to
end with an OpenAI-style error event (``end_stream``).

A non-streamed answer (``held``) is held while small: until the client has a byte, a failure
can still be retried on another engine. Holding a large one is what the gateway cannot afford:
four 200 MB answers held whole, then copied into a response, took 2 GB. So an answer is held up
to ``HOLD_BYTES`` and only while the gateway-wide ``HoldBudget`` covers it; beyond that it goes
to the client as it arrives (the head with the engine's Content-Length, then each chunk), in
memory bounded by the upstream's read-ahead. Once the client has bytes a failure cannot be
retried: the client's connection is cut, which a client sees as a short read, never as a
whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from router.gateway.openai.errors import (
    FirstByteTimeout,
    IdleStreamTimeout,
    ResponseTooLarge,
    ShuttingDown,
    UpstreamError,
)
from router.gateway.openai.sse import DONE
from router.gateway.upstream.client import Upstream, UpstreamRequest, UpstreamResponse
from router.gateway.upstream.deadline import Deadline
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


def stopping(deadline: Deadline) -> None:
    """Raise ``ShuttingDown`` when the gateway's stop, not the engine, ended the wait."""
    if deadline.was_cut:
        raise ShuttingDown("the gateway is shutting down; retry the request") from None


async def first_bytes(
    upstream: Upstream, request: UpstreamRequest, deadline: Deadline, seconds: float, what: str
) -> tuple[UpstreamResponse, bytes]:
    """Send ``request`` and wait for its answer's first bytes, within ``seconds`` of the
    started ``deadline``; ``FirstByteTimeout`` (naming ``what`` did not come) when it runs
    out. An answer whose first bytes never came is aborted before the error goes up."""
    engine = request.engine
    try:
        resp = await upstream.send(request)
        try:
            return resp, await resp.read_chunk()
        except BaseException:
            resp.abort()
            raise
    except asyncio.CancelledError:
        if deadline.expired():
            stopping(deadline)
            raise FirstByteTimeout(f"{engine} sent no {what} within {seconds:g}s", engine) from None
        raise
    finally:
        deadline.stop()


class Body:
    """An engine's answer body, each read within the idle timeout under the attempt's deadline."""

    __slots__ = ("deadline", "engine", "idle_seconds", "resp")

    def __init__(
        self, resp: UpstreamResponse, engine: str, deadline: Deadline, idle_seconds: float
    ) -> None:
        self.resp = resp
        self.engine = engine
        self.deadline = deadline
        self.idle_seconds = idle_seconds

    async def next(self) -> bytes:
        """The engine's next bytes, within the idle timeout; b"" at the end."""
        deadline = self.deadline
        deadline.start(self.idle_seconds)
        try:
            return await self.resp.read_chunk()
        except asyncio.CancelledError:
            if deadline.expired():
                stopping(deadline)
                msg = f"{self.engine} sent nothing for {self.idle_seconds:g}s"
                raise IdleStreamTimeout(msg, self.engine) from None
            raise
        finally:
            deadline.stop()

    async def rest(self, first: bytes, limit: int) -> bytes:
        """The whole body, ``first`` and what follows it, at most ``limit`` bytes."""
        parts = [first]
        size = len(first)
        chunk = first
        while chunk:
            chunk = await self.next()
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(f"{self.engine} answered with more than {limit} bytes")
        return b"".join(parts)


@dataclass(slots=True)
class Answer:
    """An answer on its way to the client, and how its relay ended."""

    response: web.StreamResponse
    tail: UsageTail  # its last bytes, for the usage it reports
    complete: bool = False  # the engine's whole body was read and sent on
    broken: UpstreamError | None = None  # the engine failed once the client had bytes
    client_gone: bool = False
    stopped: ShuttingDown | None = None  # cut short by the gateway's stop (runtime.drain)


async def stream(
    request: web.Request, body: Body, first: bytes, first_sent: Callable[[], None]
) -> Answer:
    """Relay an event stream as it arrives, ``first`` first; ``first_sent()`` once the client
    has its first bytes. ``complete``: the engine's whole body was read (nothing after [DONE]
    is left to drain before its connection is reused).

    Once the client has a byte nothing is retried: an engine failure (``broken``) or the
    gateway's stop (``stopped``) leaves the stream open for ``end_stream``, and a client that
    left ends the relay (the caller closes the engine's connection, which stops its generation).
    """
    resp = body.resp
    out = EventStream(status=resp.status, headers=client_headers(resp.headers))
    answer = Answer(out, UsageTail())
    tail = answer.tail
    tail.feed(first)
    chunk, unsent, at_event = first, True, True
    try:
        await out.prepare(request)  # the head waits for the first bytes (EventStream)
        try:
            while True:
                if resp.finished() or ends_stream(chunk, at_event):
                    # The engine is done, or its stream is (its API's last event came):
                    # the last bytes and the end go out in one send. The client may hang
                    # up the moment it reads [DONE] (the openai client does); the request
                    # is answered now, not when the engine closes.
                    await out.write_eof(chunk)
                    break
                await out.write(chunk)
                if unsent:
                    first_sent()
                    unsent = False
                at_event = chunk.endswith(b"\n\n")
                chunk = await body.next()
                if not chunk:
                    with contextlib.suppress(ConnectionResetError):
                        await out.write_eof()
                    break
                tail.feed(chunk)
        except UpstreamError as e:
            answer.broken = e
            return answer
        except ShuttingDown as e:
            answer.stopped = e
            return answer
    except ConnectionResetError:
        answer.client_gone = True
        return answer
    if unsent:
        first_sent()
    answer.complete = resp.finished()
    return answer


async def end_stream(answer: Answer, event: bytes) -> None:
    """End a stream that failed after it started with ``event`` (its API's error event)."""
    try:
        await answer.response.write_eof(event)
    except ConnectionResetError:
        answer.client_gone = True


async def held(request: web.Request, body: Body, first: bytes, budget: HoldBudget) -> Answer:
    """Send the engine's body (``first``, then the rest as it comes) to the client, held whole
    while small and ``budget`` covers it, else passed on as it arrives.

    Raises ``UpstreamError`` only while the client has no byte (the answer can be retried).
    """
    resp = body.resp
    tail = UsageTail()
    tail.feed(first)
    parts, size = [first], len(first)
    reserved = HOLD_BYTES if budget.take(HOLD_BYTES) else 0
    try:
        complete = resp.finished()
        while not complete and size <= reserved:
            chunk = await body.next()
            if chunk:
                parts.append(chunk)
                size += len(chunk)
                tail.feed(chunk)
            complete = not chunk or resp.finished()
        if complete:
            whole_body = parts[0] if len(parts) == 1 else b"".join(parts)
            whole = web.Response(
                status=resp.status, body=whole_body, headers=client_headers(resp.headers)
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
        budget.give(reserved)
    parts.clear()
    return await _pass_on(request, answer, body)


async def _pass_on(request: web.Request, answer: Answer, body: Body) -> Answer:
    """The rest of a large answer, chunk by chunk as it arrives."""
    out = answer.response
    try:
        while chunk := await body.next():
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
            answer.stopped = e
        out.force_close()
        if request.transport is not None:
            request.transport.abort()  # no end: the client must not take it for a whole answer
        with contextlib.suppress(ConnectionResetError):
            await out.write_eof()
    return answer


def is_json_object(body: bytes) -> bool:
    """True when ``body`` is a JSON object (an engine's error in a shape clients parse)."""
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False


# The named events that end the other APIs' streams: Anthropic's, and the Responses API's
# end states (neither sends [DONE]).
LAST_EVENTS = (
    b"event: message_stop\n",
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
)


def ends_stream(chunk: bytes, at_event: bool) -> bool:
    """True when ``chunk`` ends with a stream's last event whole (OpenAI's ``data: [DONE]``,
    or one of ``LAST_EVENTS``): after a blank line in the chunk, or alone in it when the bytes
    before it ended an event (``at_event``). Event data is JSON, which escapes line breaks, so a
    blank line only ever ends an event."""
    if not chunk.endswith(DONE):
        if not chunk.endswith(b"\n\n"):
            return False
        blank = chunk.rfind(b"\n\n", 0, len(chunk) - 2)
        if blank == -1 and not at_event:
            return False
        return chunk.startswith(LAST_EVENTS, blank + 2 if blank != -1 else 0)
    before = len(chunk) - len(DONE)
    return chunk.endswith(b"\n\n", 0, before) if before else at_event


class EventStream(web.StreamResponse):
    """A streamed response whose head leaves with its first bytes, in one send.

    aiohttp's ``StreamResponse`` sends its head at ``prepare()``, one more syscall, TCP segment
    and client wake-up per stream than needed; ``web.Response`` holds its head back for the
    body through the class attribute below. It is private to aiohttp, so
    tests/gateway/upstream/test_relay.py pins that a stream's head and first event leave in one
    write.
    """

    _send_headers_immediately = False
