"""Traces of requests in OpenTelemetry's terms, recorded and exported by the router itself.

- ``tracer``: ``Tracing``, and each request's ``RequestTrace``: the server span, its admission,
  decision and attempt children, and the W3C context each attempt sends its engine.
- ``context``: the client's ``traceparent`` and ``tracestate`` read, and the head sampler's
  verdict, before anything is recorded (a dropped request records nothing).
- ``spans``: a span as recorded: slots, ids and times; no SDK objects.
- ``otlp``: spans written onto OTLP's protobuf wire directly (no I/O).
- ``export``: the bounded queue of finished spans and the thread that sends them in batches.
- ``transports``: one export request over OTLP/gRPC or OTLP/HTTP.

Why not the OpenTelemetry SDK: at a sampling ratio of 1.0 its span objects and its
pure-Python encoder cost a request as much CPU again as the rest of its handling
(bench/RESULTS.md, "Tracing"). The wire format, the W3C headers and the ``OTEL_*`` variables
are the standard ones; the tests decode what is sent with opentelemetry-proto's classes.
"""
