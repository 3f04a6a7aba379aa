"""A split request under SGLang's protocol: one body to a prefill and a decode engine at once.

Each pair gets the client's body with a fresh ``bootstrap_room`` and the prefill engine's
``bootstrap_host`` and ``bootstrap_port`` (``wire.sglang``), sent to both at the same moment:
the prefill request read and dropped (router.gateway.disagg.prefill: its lease charges the
prompt there and records it at its answer), the decode attempt run as any attempt of the
exchange (leased with ``prefills=False``, recorded at its first byte, relayed with the
protocol's fields stripped: router.gateway.disagg.answers).

The two halves need each other until the decode engine's first byte: a prefill that fails
before then gives the decode attempt up (its connection closed, its abort posted), and a
decode attempt that fails gives the prefill up (aborted likewise). Either way the pair is
redone, after the retry budget's say, with the failed side replaced by the next engine of its
plan and a new room; the failure is counted and blamed as any attempt's, at most
``limits.max_attempts`` pairs in all. A prefill's 4xx before the first byte is its verdict on
the request, relayed. A client that leaves cancels both (each aborted); once the decode is
done, a prefill still answering is closed with no abort.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from router.core.disaggregation import Disaggregated
from router.gateway.disagg import wire
from router.gateway.disagg.answers import StrippingUpstream
from router.gateway.disagg.prefill import Answer, Exchanging, Prefill, Suspects, refusal
from router.gateway.openai.errors import UpstreamError

log = logging.getLogger(__name__)


class PairFailed(Exception):
    """One side of a pair failed before the decode engine's first byte."""

    def __init__(self, engine: str, error: UpstreamError) -> None:
        super().__init__(str(error))
        self.engine = engine
        self.error = error


def _next(engines: Sequence[str], i: int, other: str) -> int:
    """The index after ``i`` of the next engine in ``engines`` that is not ``other``."""
    i += 1
    while i < len(engines) and engines[i] == other:
        i += 1
    return i


async def run(
    ex: Exchanging,
    split: Disaggregated,
    client: Mapping[str, Any],
    headers: Sequence[tuple[str, str]],
    suspects: Suspects,
) -> web.StreamResponse:
    """Pairs (decode, prefill) from the two plans until one answers or nothing is left."""
    dd, pd = split.decode, split.prefill
    assert dd is not None and pd is not None, "a split names both sides"
    decoders, prefillers = dd.plan(), pd.plan()
    limit = max(1, ex.s.limits.max_attempts)
    di = pi = 0
    replaced = ""  # the engine standing in for the side that failed
    for attempt in range(1, limit + 1):
        d_engine, p_engine = decoders[di], prefillers[pi]
        if attempt > 1:
            await ex._before_retry(attempt, replaced)
        try:
            return await _pair(ex, split, d_engine, p_engine, client, headers, attempt)
        except PairFailed as f:
            e = f.error
            ex.trace.attempt_end(e.label)
            ex._failed(f.engine, e, blame=not e.request_shaped)
            if e.request_shaped and suspects:
                log.warning(
                    "%s %s: failed on %s (%s) and on %s (%s): the request's fault, not retried",
                    ex.id, ex.route, suspects[0][0], suspects[0][1], f.engine, e,
                )  # fmt: skip
                raise e from None
            if e.request_shaped:
                suspects.append((f.engine, e))
            if f.engine == p_engine:
                pi = _next(prefillers, pi, d_engine)
            else:
                di = _next(decoders, di, p_engine)
            if attempt == limit or pi >= len(prefillers) or di >= len(decoders):
                log.warning(
                    "%s %s: pair %d (%s, %s) failed at %s: %s",
                    ex.id, ex.route, attempt, p_engine, d_engine, f.engine, e,
                )  # fmt: skip
                ex._blame(suspects)
                raise e from None
            replaced = prefillers[pi] if f.engine == p_engine else decoders[di]
    raise AssertionError("unreachable: the last pair returns or raises")


async def _pair(
    ex: Exchanging,
    split: Disaggregated,
    d_engine: str,
    p_engine: str,
    client: Mapping[str, Any],
    headers: Sequence[tuple[str, str]],
    attempt: int,
) -> web.StreamResponse:
    """One pair's requests, sent at once; the decode engine's answer; ``PairFailed``."""
    s = ex.s
    dd, pd = split.decode, split.prefill
    assert dd is not None and pd is not None
    host, port = wire.bootstrap_host(p_engine), s.pool.bootstrap_port_of(p_engine)
    body = orjson.dumps(wire.sglang(client, host, port, wire.new_room()))
    ex.receipt.attempt(d_engine, attempt)
    sent = [*headers, *ex.trace.attempt(d_engine, attempt)]
    now = s.clock()
    p_lease = s.core.acquire(pd, p_engine, now)
    d_lease = s.core.acquire(dd, d_engine, now, prefills=False)
    watch = StrippingUpstream(s.upstream)
    prefill = Prefill(ex)
    loop = asyncio.get_running_loop()
    p_task = loop.create_task(prefill.run(p_lease, body, sent))
    d_task = loop.create_task(ex._attempt(d_lease, body, sent, watch))
    gave_up = False  # the prefill failed before the first byte: the decode attempt was cut

    def prefill_ended(t: asyncio.Task[Answer]) -> None:
        nonlocal gave_up
        if t.cancelled():
            return
        error = t.exception()
        if error is None and t.result().status == 200:
            return
        if watch.answered or d_task.done():
            _late(ex, p_engine, error)
        else:
            gave_up = True
            d_task.cancel()

    p_task.add_done_callback(prefill_ended)
    # Given back when the prefill ends, whatever ends the pair: a client hanging up after its
    # answer cancels this task while it waits for the prefill below.
    p_task.add_done_callback(lambda _: s.core.release(p_lease))
    done = False  # the decode attempt ended with an answer
    try:
        try:
            resp = await d_task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not gave_up or (me is not None and me.cancelling()):
                raise  # the client left
            return _prefill_failed(ex, p_engine, p_task)
        except UpstreamError as e:
            raise PairFailed(d_engine, e) from None
        done = True
        ex.trace.attempt_end(str(resp.status))
        return resp
    finally:
        s.core.release(d_lease)
        if not p_task.done():
            prefill.quiet = done  # the answer is complete: nothing to abort
            p_task.cancel()
        await asyncio.wait({p_task})


def _prefill_failed(ex: Exchanging, engine: str, task: asyncio.Task[Answer]) -> web.Response:
    """The pair's outcome when its prefill ended first without a 200."""
    error = task.exception()
    if isinstance(error, UpstreamError):
        raise PairFailed(engine, error)
    if error is not None:
        raise error
    answer = task.result()
    ex.trace.attempt_end(str(answer.status))
    return refusal(ex, answer)


def _late(ex: Exchanging, engine: str, error: BaseException | None) -> None:
    """Count a prefill that failed once its decode engine was answering (a 4xx then: nothing
    more to say, the decode engine had the blocks)."""
    if isinstance(error, UpstreamError):
        log.info(
            "%s %s: prefill at %s failed once its pair answered: %s",
            ex.id, ex.route, engine, error,
        )  # fmt: skip
        ex._failed(engine, error, blame=not error.request_shaped)
    elif error is not None:
        log.warning("%s %s: prefill at %s: %s", ex.id, ex.route, engine, error)
