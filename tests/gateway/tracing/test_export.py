"""The export thread and both transports: batches, the bounded queue, retries, a real collector.

gRPC goes to tests.otlp's collector; HTTP to a loopback ``http.server`` that parses what it is
posted with opentelemetry-proto, as a collector's OTLP/HTTP receiver does.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from router.gateway.config.otlp_delivery import Delivery
from router.gateway.config.tracing import TraceExport
from router.gateway.tracing.export import SpanExport
from router.gateway.tracing.spans import SERVER, Span
from router.gateway.tracing.transports import ExportFailed
from router.hostport import LOOPBACK
from tests.otlp import Captured, Collector, decoded

# Batches leave when full, never on the timer, unless a test says so.
SLOW = Delivery(schedule_delay=60.0, max_queue=8, max_batch=3)


def export(delivery: Delivery = SLOW, endpoint: str = "http://unused:4317") -> TraceExport:
    return TraceExport(endpoint, "grpc", "always_on", 1.0, "svc", delivery)


def span(n: int) -> Span:
    s = Span(f"s{n}", SERVER, n + 1, 0, n, {"n": n})
    s.end = n + 1
    return s


def names(sent: Captured) -> list[list[str]]:
    return [
        [s.name for ss in r.resource_spans[0].scope_spans for s in ss.spans] for r in sent.requests
    ]


def test_export_sends_full_batches_and_the_rest_at_close() -> None:
    sent = Captured()
    resource = (("k8s.pod.name", "router-0"), ("service.name", "from-resource-attributes"))
    out = SpanExport(export(replace(SLOW, resource=resource)), sent)
    for n in range(7):
        out.add(span(n))
    out.close(5.0)
    assert sorted(names(sent)) == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6"]]
    assert out.exported == 7 and out.dropped == 0
    attributes = sent.requests[0].resource_spans[0].resource.attributes
    got = {a.key: a.value.string_value for a in attributes}
    assert got["service.name"] == "svc"  # OTEL_SERVICE_NAME or the config win
    assert got["k8s.pod.name"] == "router-0" and got["telemetry.sdk.name"] == "kvrouter"


def test_export_full_queue_drops_the_newest_and_counts_them() -> None:
    sending, blocked = threading.Event(), threading.Event()

    class Stuck(Captured):
        def send(self, body: bytes, timeout: float) -> None:
            sending.set()
            blocked.wait(10)
            super().send(body, timeout)

    sent = Stuck()
    out = SpanExport(export(replace(SLOW, max_queue=8, max_batch=4)), sent)
    for n in range(4):  # a full batch: the export thread takes it and is stuck sending it
        out.add(span(n))
    assert sending.wait(5.0)
    for n in range(4, 16):  # the queue holds eight of these twelve
        out.add(span(n))
    assert out.dropped == 4
    blocked.set()
    out.close(5.0)
    assert [s.name for s in sent.spans()] == [f"s{n}" for n in range(12)]


class Flaky(Captured):
    def __init__(self, failures: int, retryable: bool) -> None:
        super().__init__()
        self.failures, self.retryable, self.calls = failures, retryable, 0

    def send(self, body: bytes, timeout: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ExportFailed("busy", self.retryable)
        super().send(body, timeout)


def test_export_retries_a_retryable_failure_and_drops_a_refused_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("router.gateway.tracing.export.FIRST_BACKOFF", 0.01)
    busy = Flaky(2, retryable=True)
    out = SpanExport(export(replace(SLOW, schedule_delay=0.01)), busy)
    out.add(span(1))
    out.close(5.0)
    assert (busy.calls, out.exported, out.dropped) == (3, 1, 0)
    refused = Flaky(5, retryable=False)
    out = SpanExport(export(replace(SLOW, schedule_delay=0.01)), refused)
    out.add(span(1))
    out.close(5.0)
    assert (refused.calls, out.exported, out.dropped) == (1, 0, 1)


def test_export_over_grpc_reaches_a_collector_with_headers_and_gzip() -> None:
    d = replace(SLOW, headers=(("X-Api-Key", "k 1"),), gzip=True, schedule_delay=0.01)
    with Collector() as collector:
        out = SpanExport(export(d, collector.endpoint))
        out.add(span(1))
        out.close(5.0)
        assert [s.name for s in collector.spans()] == ["s1"]
        assert collector.metadata[0]["x-api-key"] == "k 1"
    assert out.dropped == 0


def test_export_over_grpc_to_nobody_drops_the_batch_within_its_deadline() -> None:
    d = replace(SLOW, timeout=0.2, export_timeout=0.5, schedule_delay=0.01)
    with Collector() as gone:
        endpoint = gone.endpoint  # a port nobody listens on once the block ends
    out = SpanExport(export(d, endpoint))
    out.add(span(1))
    out.close(5.0)
    assert (out.exported, out.dropped) == (0, 1)


class _Receiver(http.server.BaseHTTPRequestHandler):
    got: list[tuple[dict[str, str], ExportTraceServiceRequest]]
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.got.append((dict(self.headers), ExportTraceServiceRequest.FromString(body)))
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, type[_Receiver]]]:
    for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)  # loopback only, whatever the runner's proxy
    handler = type("Receiver", (_Receiver,), {"got": []})
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}/v1/traces", handler
    finally:
        server.shutdown()
        server.server_close()


def test_export_over_http_posts_protobuf_with_headers_and_gzip(
    receiver: tuple[str, type[_Receiver]],
) -> None:
    url, handler = receiver
    d = replace(SLOW, headers=(("Authorization", "Bearer t"),), gzip=True, schedule_delay=0.01)
    out = SpanExport(replace(export(d, url), protocol="http/protobuf"))
    out.add(span(1))
    out.close(5.0)
    ((headers, request),) = handler.got
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Authorization"] == "Bearer t"
    assert [s.name for s in decoded(request)] == ["s1"]


def test_export_over_http_a_refusal_is_not_retried(receiver: tuple[str, type[_Receiver]]) -> None:
    url, handler = receiver
    handler.status = 400
    d = replace(SLOW, schedule_delay=0.01)
    out = SpanExport(replace(export(d, url), protocol="http/protobuf"))
    out.add(span(1))
    out.close(5.0)
    assert (len(handler.got), out.dropped) == (1, 1)


def test_export_woken_by_a_full_batch_leaves_the_remainder_for_the_timer() -> None:
    first = threading.Event()

    class Signalling(Captured):
        def send(self, body: bytes, timeout: float) -> None:
            super().send(body, timeout)
            first.set()

    sent = Signalling()
    out = SpanExport(export(), sent)
    for n in range(4):  # one full batch of 3, and one span over
        out.add(span(n))
    assert first.wait(5.0)
    time.sleep(0.2)  # time enough for a second export, were the remainder sent at once
    assert names(sent) == [["s0", "s1", "s2"]]
    out.close(5.0)
    assert names(sent) == [["s0", "s1", "s2"], ["s3"]]
