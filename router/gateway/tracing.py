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
(router.gateway.trace_context) decides before the SDK sees the request: a dropped one costs
its ids and one formatted header, no span, and the engines get its context with the sampled
flag off. Spans are exported in batches from the SDK's own thread
(OTLP over gRPC, or HTTP with the ``otlp-http`` extra); ``Tracing.close`` flushes them.
What is exported, and which standard ``OTEL_*`` variable wins over which field, is
router.gateway.config.tracing's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from router.core.fields import ConfigError
from router.core.verdict import Decision
from router.gateway.config.tracing import TraceExport
from router.gateway.trace_context import HeadSampler, Parent, parent_of, traceparent

# The decision span names this many engines of the plan with their scores.
TOP_SCORES = 3
FLUSH_TIMEOUT_MILLIS = 5000

_PROPAGATOR = TraceContextTextMapPropagator()
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

    __slots__ = ("_attempt", "_ctx", "_span", "_tracer", "_waiting")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer, self._span = tracer, span
        self._ctx = trace.set_span_in_context(span)
        self._waiting: trace.Span | None = None
        self._attempt: trace.Span | None = None

    def admission(self) -> None:
        self._waiting = self._tracer.start_span("admission", self._ctx)

    def admitted(self) -> None:
        span, self._waiting = self._waiting, None
        if span is not None:
            span.end()

    def decision(self, d: Decision, seconds: float) -> None:
        end = time.time_ns()
        span = self._tracer.start_span(
            "decision", self._ctx, start_time=end - int(seconds * 1e9), attributes=_explained(d)
        )
        span.end(end_time=end)

    def attempt(self, engine: str, n: int) -> Sequence[tuple[str, str]]:
        self.attempt_end("abandoned")
        self._attempt = span = self._tracer.start_span(
            "attempt",
            self._ctx,
            kind=SpanKind.CLIENT,
            attributes={"kvrouter.engine": engine, "kvrouter.attempt": n},
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return tuple(carrier.items())

    def first_byte(self) -> None:
        if self._attempt is not None:
            self._attempt.add_event("first_byte")

    def attempt_end(self, status: str) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if status.isdigit():
            span.set_attribute("http.response.status_code", int(status))
        else:
            span.set_attribute("error.type", status)
        if not status.isdigit() or int(status) >= 500:
            span.set_status(Status(StatusCode.ERROR, status))
        span.end()

    def end(self, status: int) -> None:
        if self._waiting is not None:  # refused, timed out or left while queued
            self._waiting.set_status(Status(StatusCode.ERROR, str(status)))
            self.admitted()
        self.attempt_end("abandoned")
        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


def _explained(d: Decision) -> dict[str, str | int | float | Sequence[str] | Sequence[float]]:
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

    def __init__(self, export: TraceExport | None, exporter: SpanExporter | None = None) -> None:
        self.enabled = export is not None
        self._provider: TracerProvider | None = None
        if export is None:
            return
        # Not the global provider: the gateway's spans stay its own, whatever else is loaded.
        # The head sampler decides (router.gateway.trace_context); the SDK sees only the
        # requests it keeps.
        self._sampler = HeadSampler(export.sampler, export.ratio)
        self._ids = _ChosenTraceIds()
        self._provider = TracerProvider(
            sampler=ALWAYS_ON,
            resource=Resource.create({SERVICE_NAME: export.service_name}),
            id_generator=self._ids,
        )
        processor: SpanProcessor = BatchSpanProcessor(exporter or _exporter(export))
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("kvrouter")

    def request(self, headers: Mapping[str, str], route: str, request_id: str) -> RequestTrace:
        """The trace of one request to ``route``, continuing the client's ``traceparent``."""
        if self._provider is None:
            return NO_TRACE
        parent = parent_of(headers)
        trace_id = parent.trace_id if parent else self._ids.fresh_trace_id()
        if not self._sampler.sampled(parent, trace_id):
            return _Unsampled(self._dropped(headers, parent, trace_id))
        self._ids.chosen = trace_id  # a new trace keeps the id it was sampled by
        span = self._tracer.start_span(
            f"POST {route}",
            _PROPAGATOR.extract(headers) if parent else None,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "http.route": route,
                "kvrouter.request_id": request_id,
            },
        )
        return _Recorded(self._tracer, span)

    def _dropped(
        self, headers: Mapping[str, str], parent: Parent | None, trace_id: int
    ) -> tuple[tuple[str, str], ...]:
        """What the engines are told of a dropped request: its trace, not sampled."""
        context = (("traceparent", traceparent(trace_id, self._ids.generate_span_id(), False)),)
        if parent is None or "tracestate" not in headers:
            return context
        # Rare enough to leave the parsing and the limits of tracestate to the SDK.
        state = trace.get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
        if not state.trace_state:
            return context
        return (*context, ("tracestate", state.trace_state.to_header()))

    async def close(self) -> None:
        """Export what is still buffered (off the event loop), then stop the exporter."""
        if self._provider is not None:
            provider = self._provider
            await asyncio.to_thread(provider.force_flush, FLUSH_TIMEOUT_MILLIS)
            await asyncio.to_thread(provider.shutdown)


class _ChosenTraceIds(RandomIdGenerator):
    """Random ids, but the SDK's next new trace takes the id the sampler already judged."""

    def __init__(self) -> None:
        self.chosen = 0

    def fresh_trace_id(self) -> int:
        return super().generate_trace_id()

    def generate_trace_id(self) -> int:
        chosen, self.chosen = self.chosen, 0
        return chosen or super().generate_trace_id()


def _exporter(export: TraceExport) -> SpanExporter:
    if export.protocol == "grpc":
        # Loaded only when tracing is on: the exporter brings its gRPC stubs and protos.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=export.endpoint)
    try:
        # An optional extra: only http/protobuf needs it (and its HTTP client).
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )
    except ImportError:
        raise ConfigError(
            "tracing over http/protobuf needs opentelemetry-exporter-otlp-proto-http "
            "(pip install 'kvrouter[otlp-http]'), or protocol grpc"
        ) from None
    exporter: SpanExporter = HttpSpanExporter(endpoint=export.endpoint)
    return exporter
