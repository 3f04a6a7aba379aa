"""``Tracing`` in-process: no-op when off, every span ended however a request ends."""

from __future__ import annotations

import asyncio

from multidict import CIMultiDict
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from router.gateway.config.tracing import TraceExport
from router.gateway.tracing import NO_TRACE, Tracing

ROUTE = "/v1/chat/completions"
ALWAYS = TraceExport("http://unused:4317", "grpc", "always_on", 1.0, "kvrouter")


def finished(tracing: Tracing, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    asyncio.run(tracing.close())
    return {s.name: s for s in exporter.get_finished_spans()}


def test_tracing_off_hands_out_the_shared_no_op() -> None:
    off = Tracing(None)
    t = off.request(CIMultiDict(), ROUTE, "rid")
    assert t is NO_TRACE and not off.enabled
    assert t.attempt("http://e", 1) == ()
    t.end(200)


def test_tracing_request_left_while_queued_ends_its_admission_failed() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(ALWAYS, exporter)
    t = tracing.request(CIMultiDict(), ROUTE, "rid")
    t.admission()
    t.end(429)
    spans = finished(tracing, exporter)
    assert spans["admission"].status.status_code is StatusCode.ERROR
    assert spans[f"POST {ROUTE}"].attributes == {
        "http.request.method": "POST",
        "http.route": ROUTE,
        "kvrouter.request_id": "rid",
        "http.response.status_code": 429,
    }


def test_tracing_attempt_open_at_the_end_is_ended_abandoned() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(ALWAYS, exporter)
    t = tracing.request(CIMultiDict(), ROUTE, "rid")
    headers = dict(t.attempt("http://e", 1))
    t.first_byte()
    t.end(499)  # the client left mid-answer
    spans = finished(tracing, exporter)
    attempt = spans["attempt"]
    assert attempt.attributes is not None and attempt.attributes["error.type"] == "abandoned"
    assert [e.name for e in attempt.events] == ["first_byte"]
    assert attempt.context is not None
    assert headers["traceparent"].split("-")[2] == f"{attempt.context.span_id:016x}"


def test_tracing_attempt_carries_the_clients_trace_and_tracestate_on() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(ALWAYS, exporter)
    client = CIMultiDict(
        {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "vendor=opaque",
        }
    )
    t = tracing.request(client, ROUTE, "rid")
    headers = dict(t.attempt("http://e", 1))
    t.attempt_end("200")
    t.end(200)
    spans = finished(tracing, exporter)
    assert headers["tracestate"] == "vendor=opaque"
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    attempt = spans["attempt"]
    assert attempt.context is not None and parent == f"{attempt.context.span_id:016x}"
    server = spans[f"POST {ROUTE}"]
    assert server.parent is not None and server.parent.span_id == 0x00F067AA0BA902B7
