"""Traces of requests: a server span per request, its steps as children, context to engines.

    POST /v1/chat/completions     (server; parent: the client's traceparent, when it sent one)
      admission                   the wait in the gateway's queue
      decision                    candidates, the pick, the reason, the top scores
      attempt                     (client; one per engine tried) engine, status; the engine's
                                  first byte is an event on it

Every attempt sends the engine a W3C ``traceparent`` naming its attempt span (and the client's
``tracestate``), so an engine that continues traces (vLLM with ``--otlp-traces-endpoint``)
hangs its spans under the router's, in the same trace. The client's own ``traceparent`` and
``tracestate`` are then not relayed (router.gateway.upstream.headers.engine_headers drops them):
the engine's parent is the router's span, whose own parent is the client's.

Off (the default), ``Tracing.request`` hands out one shared ``RequestTrace`` whose every method
does nothing, and the client's trace headers reach the engines untouched. On, the head sampler
(router.gateway.tracing.context) decides first: a dropped request costs its ids and one
formatted header, no span, and the engines get its context with the sampled flag off. A kept
one records plain spans (router.gateway.tracing.spans), which the export thread sends in
batches over OTLP/gRPC or OTLP/HTTP; ``Tracing.close`` flushes them. What is exported, and
which standard ``OTEL_*`` variable wins over which field, is router.gateway.config.tracing's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from router.core.verdict import Decision
from router.gateway.config.tracing import TraceExport
from router.gateway.tracing.context import (
    HeadSampler,
    Parent,
    parent_of,
    traceparent,
    tracestate_of,
)
from router.gateway.tracing.export import SpanExport
from router.gateway.tracing.spans import CLIENT, INTERNAL, SERVER, Span, Value, span_id, trace_id
from router.gateway.tracing.transports import Transport

# The decision span names this many engines of the plan with their scores.
TOP_SCORES = 3
FLUSH_TIMEOUT_SECONDS = 5.0
_NO_HEADERS: tuple[tuple[str, str], ...] = ()


class RequestTrace:
    """One request's trace as the exchange drives it; this base class records nothing."""

    __slots__ = ()

    def admission(self) -> None:
        """The request starts its wait for admission."""

    def admitted(self) -> None:
        """The request was admitted (a request never admitted ends its wait failed)."""

    def decision(self, d: Decision, seconds: float) -> None:
        """The decision just made, which took ``seconds``."""

    def attempt(self, engine: str, n: int) -> Sequence[tuple[str, str]]:
        """Attempt ``n`` begins at ``engine``; the trace headers the engine is to get."""
        return _NO_HEADERS

    def first_byte(self) -> None:
        """The engine of the current attempt sent its first byte."""

    def attempt_end(self, status: str) -> None:
        """The current attempt ended with ``status`` (an HTTP status, or a failure's label)."""

    def end(self, status: int) -> None:
        """The client got ``status``; the trace is done (any open attempt is ended too)."""


NO_TRACE = RequestTrace()


class _Unsampled(RequestTrace):
    """A request the sampler dropped: only its context travels, to every engine."""

    __slots__ = ("_headers",)

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self._headers = headers

    def attempt(self, engine: str, n: int) -> Sequence[tuple[str, str]]:
        return self._headers


class _Recorded(RequestTrace):
    """A sampled request: its server span and children, as the exchange reaches each step."""

    __slots__ = ("_attempt", "_out", "_server", "_waiting")

    def __init__(self, out: SpanExport, server: Span) -> None:
        self._out, self._server = out, server
        self._waiting: Span | None = None
        self._attempt: Span | None = None

    def _child(self, name: str, kind: int, start: int, attributes: dict[str, Value]) -> Span:
        s = self._server
        return Span(name, kind, s.trace_id, s.span_id, start, attributes, s.trace_state)

    def _finish(self, span: Span, end: int = 0) -> None:
        span.end = end or time.time_ns()
        self._out.add(span)

    def admission(self) -> None:
        self._waiting = self._child("admission", INTERNAL, time.time_ns(), {})

    def admitted(self) -> None:
        span, self._waiting = self._waiting, None
        if span is not None:
            self._finish(span)

    def decision(self, d: Decision, seconds: float) -> None:
        end = time.time_ns()
        span = self._child("decision", INTERNAL, end - int(seconds * 1e9), _explained(d))
        self._finish(span, end)

    def attempt(self, engine: str, n: int) -> Sequence[tuple[str, str]]:
        self.attempt_end("abandoned")
        attributes: dict[str, Value] = {"kvrouter.engine": engine, "kvrouter.attempt": n}
        self._attempt = span = self._child("attempt", CLIENT, time.time_ns(), attributes)
        parent = ("traceparent", traceparent(span.trace_id, span.span_id, True))
        return (parent, ("tracestate", span.trace_state)) if span.trace_state else (parent,)

    def first_byte(self) -> None:
        if self._attempt is not None:
            self._attempt.events.append(("first_byte", time.time_ns()))

    def attempt_end(self, status: str) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if status.isdigit():
            span.attributes["http.response.status_code"] = int(status)
        else:
            span.attributes["error.type"] = status
        if not status.isdigit() or int(status) >= 500:
            span.fail(status)
        self._finish(span)

    def end(self, status: int) -> None:
        if self._waiting is not None:  # refused, timed out or left while queued
            self._waiting.fail(str(status))
            self.admitted()
        self.attempt_end("abandoned")
        server = self._server
        server.attributes["http.response.status_code"] = status
        if status >= 500:
            server.fail()
        self._finish(server)


def _explained(d: Decision) -> dict[str, Value]:
    x = d.inputs
    top = d.plan()[:TOP_SCORES]
    return {
        "kvrouter.decision.engine": d.engine or "",
        "kvrouter.decision.reason": d.reason,
        "kvrouter.decision.candidates": len(x.candidates),
        "kvrouter.decision.blocks": len(d.keys),
        "kvrouter.decision.overlap_blocks": d.overlap_of(d.engine) if d.engine else 0,
        "kvrouter.decision.top_engines": list(top),
        "kvrouter.decision.top_scores": [round(d.totals[x.candidates.index(e)], 6) for e in top],
    }


class Tracing:
    """The gateway's tracer; without an export, every request gets ``NO_TRACE``."""

    def __init__(self, export: TraceExport | None, send: Transport | None = None) -> None:
        self.enabled = export is not None
        self._out: SpanExport | None = None
        if export is None:
            return
        self._sampler = HeadSampler(export.sampler, export.ratio)
        self._out = SpanExport(export, send)

    def request(self, headers: Mapping[str, str], route: str, request_id: str) -> RequestTrace:
        """The trace of one request to ``route``, continuing the client's ``traceparent``."""
        if self._out is None:
            return NO_TRACE
        parent = parent_of(headers)
        trace = parent.trace_id if parent else trace_id()
        if not self._sampler.sampled(parent, trace):
            return _Unsampled(self._dropped(headers, parent, trace))
        attributes: dict[str, Value] = {
            "http.request.method": "POST",
            "http.route": route,
            "kvrouter.request_id": request_id,
        }
        server = Span(
            f"POST {route}",
            SERVER,
            trace,
            parent.span_id if parent else 0,
            time.time_ns(),
            attributes,
            tracestate_of(headers) if parent else "",
        )
        return _Recorded(self._out, server)

    @staticmethod
    def _dropped(
        headers: Mapping[str, str], parent: Parent | None, trace: int
    ) -> tuple[tuple[str, str], ...]:
        """What the engines are told of a dropped request: its trace, not sampled."""
        context = (("traceparent", traceparent(trace, span_id(), False)),)
        state = tracestate_of(headers) if parent else ""
        return (*context, ("tracestate", state)) if state else context

    @property
    def dropped(self) -> int:
        """Finished spans that never reached the collector (a full queue, a failed export)."""
        return self._out.dropped if self._out is not None else 0

    async def close(self) -> None:
        """Export what is still queued (off the event loop), then stop the exporter."""
        if self._out is not None:
            await asyncio.to_thread(self._out.close, FLUSH_TIMEOUT_SECONDS)
