"""A span as the router records it: a few slots filled along the request, no SDK objects.

A sampled request makes four or five of these; the OpenTelemetry SDK's spans (context objects,
locks, attribute validation, a processor chain) cost about 20 us each to start, and their
pure-Python OTLP encoding 50 us each to export, together as much again as the rest of the
request's handling. Here a span costs one object, and router.gateway.tracing.otlp writes it
onto OTLP's wire directly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# OTLP's SpanKind and StatusCode values, as they go on the wire.
INTERNAL, SERVER, CLIENT = 1, 2, 3
UNSET, ERROR = 0, 2

Value = str | bool | int | float | Sequence[str] | Sequence[float]

_RANDOM = random.Random()


def span_id() -> int:
    """A fresh span id: 64 random bits, never zero (zero means none on the wire)."""
    return _RANDOM.getrandbits(64) or 1


def trace_id() -> int:
    """A fresh trace id: 128 random bits, never zero."""
    return _RANDOM.getrandbits(128) or 1


class Span:
    """One operation of a request: its ids, its times (Unix ns), attributes, events, status."""

    __slots__ = (
        "attributes",
        "end",
        "events",
        "kind",
        "message",
        "name",
        "parent_id",
        "span_id",
        "start",
        "status",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: int,
        trace_id: int,
        parent_id: int,
        start: int,
        attributes: dict[str, Value],
        trace_state: str = "",
    ) -> None:
        self.name, self.kind, self.start, self.attributes = name, kind, start, attributes
        self.trace_id, self.parent_id, self.trace_state = trace_id, parent_id, trace_state
        self.span_id = span_id()
        self.end = 0
        self.events: list[tuple[str, int]] = []
        self.status = UNSET
        self.message = ""

    def fail(self, message: str = "") -> None:
        """Mark the span's operation failed."""
        self.status, self.message = ERROR, message
