"""How an exchange's answer ended, counted: the settling of a relayed answer.

A relay (router.gateway.upstream.relay) ends in an ``Answer`` that says how: whole, broken off
by the engine, cut short by the client leaving, or stopped by the gateway's shutdown. Settling
turns that into what the gateway counts and what the client was shown:

    broken off      the attempt failed (``Exchange._failed``); a stream ends with an error event
    client gone     status 499 (``CLIENT_GONE``), the engine not blamed
    stopped         the shutdown's status; a stream ends with its error event
    whole           the engine answered (``Exchange._answered``); a generation's usage counted,
                    and the router's prompt tokens calibrated against the engine's count

A stream is settled once, when the client has it in full (its [DONE] went out): a disconnect
after that is the client being done. Its engine's connection is reused only when nothing but
the end followed [DONE].

The exchange (router.gateway.exchange) calls ``held`` or ``stream`` once per answer it relays;
both read and write the few fields of the exchange that ``Settling`` names, and keep no state
of their own.
"""

from __future__ import annotations

import logging
from typing import Protocol

from router.gateway.openai.errors import Api, ShuttingDown, UpstreamError, stream_error
from router.gateway.receipt import Receipt
from router.gateway.upstream import relay
from router.gateway.upstream.headers import UsageTail
from router.gateway.wiring import Services

log = logging.getLogger(__name__)

# Routes whose prompt tokens feed the cache hit ratio (embeddings have no prefix cache).
GENERATION_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
)
CLIENT_GONE = 499


class Settling(Protocol):
    """The exchange as settling reads and writes it (router.gateway.exchange's ``Exchange``)."""

    s: Services
    id: str
    route: str
    api: Api
    status: int
    delivered: bool
    receipt: Receipt

    def _failed(self, engine: str, error: UpstreamError, *, blame: bool = True) -> None: ...

    def _answered(self, engine: str, status: int) -> None: ...


def held(ex: Settling, engine: str, status: int, answer: relay.Answer) -> None:
    """Count a non-streamed answer by how its relay ended."""
    if answer.broken is not None:
        e = answer.broken
        log.warning("%s %s: answer from %s broke off: %s", ex.id, ex.route, engine, e)
        ex._failed(engine, e)
        ex.status = e.status
    elif answer.client_gone:
        ex.status = CLIENT_GONE
    elif answer.stopped:
        ex.status = ShuttingDown.status
    else:
        ex._answered(engine, status)
        if status == 200 and ex.route in GENERATION_ROUTES:
            _count_usage(ex, answer.tail.json_usage())


async def stream(ex: Settling, body: relay.Body, answer: relay.Answer) -> bool:
    """Count a streamed answer by how its relay ended, and end a failed one with an error
    event; True when the engine's connection can be reused."""
    engine = body.engine
    error = answer.broken or answer.stopped
    if error is not None:
        if answer.broken is not None:
            e = answer.broken
            log.warning("%s %s: stream from %s broke off: %s", ex.id, ex.route, engine, e)
            ex._failed(engine, e)
        ex.status = error.status
        await relay.end_stream(answer, stream_error(error, request_id=ex.id, api=ex.api))
    if answer.client_gone:
        log.debug("%s %s: client left during the stream from %s", ex.id, ex.route, engine)
        ex.status = CLIENT_GONE
        return False
    if error is not None:
        return False
    _delivered(ex, engine, answer.response.status, answer.tail)
    return answer.complete or await _after_done(ex, body)


async def _after_done(ex: Settling, body: relay.Body) -> bool:
    """Read the engine's end after [DONE], only to reuse its connection; True when nothing
    but the end came (the client's answer is complete whatever happens here)."""
    engine = body.engine
    try:
        extra = await body.next()
    except UpstreamError as e:
        log.debug("%s %s: %s failed after [DONE]: %s", ex.id, ex.route, engine, e)
        return False
    if extra:
        log.debug(
            "%s %s: %s sent %d bytes after [DONE]; dropped",
            ex.id,
            ex.route,
            engine,
            len(extra),
        )
        return False
    return True


def _delivered(ex: Settling, engine: str, status: int, tail: UsageTail) -> None:
    """Count a stream the client has in full (once, whichever end is seen first)."""
    if ex.delivered:
        return
    ex.delivered = True
    ex.status = status
    ex._answered(engine, status)
    if ex.route in GENERATION_ROUTES:
        _count_usage(ex, tail.usage())


def _count_usage(ex: Settling, counts: tuple[int, int] | None) -> None:
    if counts is not None:
        ex.s.metrics.usage(*counts)
        ex.receipt.usage = counts
        d = ex.receipt.decision
        if d is not None:  # the engine's count of the prompt against the router's
            ex.s.core.calibrate(d.prompt_tokens, counts[0])
