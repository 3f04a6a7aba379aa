"""``Tracing`` in-process: no-op when off, every span ended however a request ends.

The spans are read back as a collector would: the export requests the transport was handed,
parsed by opentelemetry-proto (tests.otlp.Captured).
"""

from __future__ import annotations

import asyncio

from multidict import CIMultiDict

from router.gateway.config.tracing import TraceExport
from router.gateway.tracing.tracer import NO_TRACE, Tracing
from tests.otlp import Captured, Received

ROUTE = "/v1/chat/completions"
ALWAYS = TraceExport("http://unused:4317", "grpc", "always_on", 1.0, "kvrouter")
ERROR = 2  # STATUS_CODE_ERROR


def finished(tracing: Tracing, sent: Captured) -> dict[str, Received]:
    asyncio.run(tracing.close())
    return {s.name: s for s in sent.spans()}


def test_tracing_off_hands_out_the_shared_no_op() -> None:
    off = Tracing(None)
    t = off.request(CIMultiDict(), ROUTE, "rid")
    assert t is NO_TRACE and not off.enabled
    assert t.attempt("http://e", 1) == ()
    t.end(200)


def test_tracing_request_left_while_queued_ends_its_admission_failed() -> None:
    sent = Captured()
    tracing = Tracing(ALWAYS, sent)
    t = tracing.request(CIMultiDict(), ROUTE, "rid")
    t.admission()
    t.end(429)
    spans = finished(tracing, sent)
    assert spans["admission"].status_code == ERROR
    server = spans[f"POST {ROUTE}"]
    assert server.attributes == {
        "http.request.method": "POST",
        "http.route": ROUTE,
        "kvrouter.request_id": "rid",
        "http.response.status_code": 429,
    }
    assert server.status_code == 0 and server.parent_id == ""
    assert spans["admission"].parent_id == server.span_id


def test_tracing_attempt_open_at_the_end_is_ended_abandoned() -> None:
    sent = Captured()
    tracing = Tracing(ALWAYS, sent)
    t = tracing.request(CIMultiDict(), ROUTE, "rid")
    headers = dict(t.attempt("http://e", 1))
    t.first_byte()
    t.end(499)  # the client left mid-answer
    spans = finished(tracing, sent)
    attempt = spans["attempt"]
    assert attempt.attributes["error.type"] == "abandoned"
    assert attempt.status_code == ERROR and attempt.kind == 3  # SPAN_KIND_CLIENT
    assert attempt.events == ("first_byte",)
    assert headers["traceparent"] == f"00-{attempt.trace_id}-{attempt.span_id}-01"


def test_tracing_attempt_carries_the_clients_trace_and_tracestate_on() -> None:
    sent = Captured()
    tracing = Tracing(ALWAYS, sent)
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
    spans = finished(tracing, sent)
    assert headers["tracestate"] == "vendor=opaque"
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    attempt = spans["attempt"]
    assert parent == attempt.span_id
    assert attempt.attributes["http.response.status_code"] == 200 and attempt.status_code == 0
    server = spans[f"POST {ROUTE}"]
    assert server.parent_id == "00f067aa0ba902b7"
    assert server.kind == 2 and server.trace_id == trace_id  # SPAN_KIND_SERVER
    request = sent.requests[0]
    assert {s.trace_state for ss in request.resource_spans[0].scope_spans for s in ss.spans} == {
        "vendor=opaque"
    }


def test_tracing_engine_failure_fails_the_attempt_and_a_5xx_the_server_span() -> None:
    sent = Captured()
    tracing = Tracing(ALWAYS, sent)
    t = tracing.request(CIMultiDict(), ROUTE, "rid")
    t.attempt("http://a", 1)
    t.attempt_end("503")
    t.attempt("http://b", 2)
    t.attempt_end("connect_failed")
    t.end(502)
    asyncio.run(tracing.close())
    spans = sent.spans()
    attempts = [s for s in spans if s.name == "attempt"]
    assert [s.attributes["kvrouter.engine"] for s in attempts] == ["http://a", "http://b"]
    assert [s.status_code for s in attempts] == [ERROR, ERROR]
    assert attempts[1].attributes["error.type"] == "connect_failed"
    (server,) = (s for s in spans if s.name == f"POST {ROUTE}")
    assert server.status_code == ERROR and tracing.dropped == 0
