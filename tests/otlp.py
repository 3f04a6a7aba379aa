"""An OTLP trace collector inside the test process, built from the OTLP protos.

``Collector`` serves OpenTelemetry's ``TraceService`` (opentelemetry-proto's generated gRPC
service) on 127.0.0.1 and keeps what it receives as ``Received`` spans, decoded from the wire:
what a real collector would see of a kvrouter process exporting to it. bench.proxy_overhead
uses it as its sink, keeping none of the spans.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from router.gateway.tracing.transports import Transport
from router.hostport import LOOPBACK

# Spans kept at most; more are counted and dropped.
MAX_KEPT = 10_000


@dataclass(frozen=True)
class Received:
    """One span as the collector got it (ids in lowercase hex, as traceparent writes them)."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status_code: int


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def decoded(request: trace_service_pb2.ExportTraceServiceRequest) -> Iterator[Received]:
    """The spans of an export request, as ``Received``."""
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield Received(
                    service=str(resource.get("service.name", "")),
                    name=s.name,
                    kind=s.kind,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    events=tuple(e.name for e in s.events),
                    status_code=s.status.code,
                )


class Captured(Transport):
    """A transport that keeps each export request it is given, parsed by opentelemetry-proto."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def send(self, body: bytes, timeout: float) -> None:
        self.requests.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))

    def spans(self) -> list[Received]:
        return [s for r in self.requests for s in decoded(r)]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A collector on a free loopback port while its ``with`` block runs."""

    def __init__(self, *, keep: bool = True) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._spans: list[Received] = []
        self.metadata: list[dict[str, str]] = []  # each export's gRPC metadata
        self.count = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{LOOPBACK}:0")

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> Collector:
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.stop(grace=None)

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        got = list(decoded(request)) if self._keep else []
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.count += n
            if len(self.metadata) < MAX_KEPT:
                self.metadata.append(dict(context.invocation_metadata()))
            self._spans.extend(got[: max(0, MAX_KEPT - len(self._spans))])
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self, trace_id: str | None = None) -> list[Received]:
        """The spans received so far (of one trace, when given)."""
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]
