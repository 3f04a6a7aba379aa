"""Finished spans, queued by the event loop and sent in batches from one thread of their own.

The loop's share is one ``deque.append`` a span; encoding (router.gateway.tracing.otlp) and the
blocking export (router.gateway.tracing.transports) happen on the export thread, which wakes
every ``schedule_delay`` or as soon as a batch is full, as the SDK's batch processor does. The
queue is bounded (``max_queue``): a span that finds it full is dropped and counted, never
waited for. A retryable failure is retried with backoff within ``export_timeout`` (and, once
closing, within the close's timeout); a batch that still fails is dropped and counted, and the
log says so at most once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from router import __version__
from router.gateway.config.tracing import TraceExport
from router.gateway.tracing.otlp import Encoder
from router.gateway.tracing.spans import Span
from router.gateway.tracing.transports import ExportFailed, Transport, transport

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 8.0
LOG_EVERY = 60.0


class SpanExport:
    """The export thread and its queue; ``close`` sends what is queued, then stops."""

    def __init__(self, export: TraceExport, send: Transport | None = None) -> None:
        d = export.delivery
        # OTEL_RESOURCE_ATTRIBUTES first: the service's name and the SDK's own keys win.
        resource = {
            **dict(d.resource),
            "service.name": export.service_name,
            "telemetry.sdk.language": "python",
            "telemetry.sdk.name": "kvrouter",
            "telemetry.sdk.version": __version__,
        }
        self._encoder = Encoder(resource.items(), "kvrouter", __version__)
        self._transport = send or transport(export)
        self._delay, self._timeout, self._deadline = d.schedule_delay, d.timeout, d.export_timeout
        self._max_queue, self._max_batch = d.max_queue, d.max_batch
        self._queue: deque[Span] = deque()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._close_by = float("inf")  # retries stop here once closing
        # Each counted by one thread: the loop counts the full queue's, the export thread the rest.
        self._full = self._failed = 0
        self.exported = 0
        self._logged = 0.0
        self._thread = threading.Thread(target=self._run, name="kvrouter-spans", daemon=True)
        self._thread.start()

    def add(self, span: Span) -> None:
        """Queue a finished span (on the event loop: never blocks)."""
        q = self._queue
        if len(q) >= self._max_queue:
            self._full += 1
            self._warn("the span queue is full")
            return
        q.append(span)
        if len(q) >= self._max_batch:
            self._wake.set()

    def close(self, timeout: float) -> None:
        """Send what is queued (for up to ``timeout`` seconds), then stop the thread (blocks)."""
        self._close_by = time.monotonic() + timeout
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout)
        self._transport.close()

    def _run(self) -> None:
        while not self._closing.is_set():
            full = self._wake.wait(self._delay)
            self._wake.clear()
            # Woken by a full batch: send full batches only, or a busy router would send the
            # few spans that arrived meanwhile at once, and pay a call for every few spans.
            self._drain(everything=not full)
        self._drain(everything=True)

    def _drain(self, everything: bool) -> None:
        q, size = self._queue, self._max_batch
        # Only this thread takes from the queue, so each pop finds its span.
        while len(q) >= size or (everything and q):
            batch = [q.popleft() for _ in range(min(len(q), size))]
            self._deliver(self._encoder.request(batch), len(batch))

    def _deliver(self, body: bytes, n: int) -> None:
        end = min(time.monotonic() + self._deadline, self._close_by)
        backoff = FIRST_BACKOFF
        while True:
            left = end - time.monotonic()
            try:
                self._transport.send(body, max(0.001, min(self._timeout, left)))
            except ExportFailed as e:
                wait = min(backoff, end - time.monotonic())
                if not e.retryable or wait <= 0:
                    self._failed += n
                    self._warn(f"the collector: {e}")
                    return
                time.sleep(wait)
                backoff = min(backoff * 2, MAX_BACKOFF)
            else:
                self.exported += n
                return

    @property
    def dropped(self) -> int:
        """Spans lost to a full queue or a failed export."""
        return self._full + self._failed

    def _warn(self, why: str) -> None:
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY:
            self._logged = now
            log.warning("tracing: %s; %d spans dropped so far", why, self.dropped)
