"""A receipt per request: what happened to it, written once as a JSON line when it ends.

The exchange (router.gateway.exchange) fills one ``Receipt`` as the request goes: its tenant
and model, the wait for admission, the decision, each attempt, the engine's first byte and
``usage``; its ``finally`` hands it to ``Receipts.close``, which counts the routing-quality
metrics (router.gateway.quality) and writes the access-log line: one JSON object on standard
error, while the logger ``kvrouter.access`` is enabled for INFO (the process's log level, or
its own), with these fields:

- ``request_id``, ``route``, ``status`` (what the client saw; 499: it went away), ``tenant``
  (flow control's: the authenticated API key's name, else the tenant header, else ``key:`` and
  a digest of the bearer token, never the token, else ``user:`` and a digest), ``model``;
- ``engine``: the engine of the last attempt (null: none was made); ``attempts``; ``path``:
  ``routed`` (the decision's pick answered), ``retry`` (a fallback answered after attempts
  failed), ``failed`` (the client got a 5xx after attempts), ``rejected`` (never sent: a bad
  request, flow control's 429, no engine);
- ``queue_wait_ms`` (in flow control's queue, until admitted or turned away; null: the request
  never reached it), ``ttft_ms`` (from arrival to the engine's first byte of a 200 answer;
  null: none came), ``duration_ms``;
- ``prompt_tokens`` (the engine's ``usage`` when given, else the router's estimate),
  ``believed`` (tokens the engine that took it was believed to hold), ``reachable`` (the
  deepest eligible holder's), ``cached_tokens`` (the engine's ``usage``; null: not reported),
  ``not_deepest`` (``Decision.not_deepest``), ``divergence_block`` (the request's first block
  no engine held), ``prefix_broken_at`` (for a conversation's follow-up turn whose history
  changed: ``{block, char_offset}``, see router.core.turns).

Never prompt text, API keys or engine credentials: the line is built from the fields above
only. It is written straight to standard error, not through the logger's handlers (a log
record costs about 15 microseconds, more than everything else a receipt does), and the lines
of requests that end in one turn of the event loop go out in one write at the end of that
turn (standard error is line-buffered: every line written alone is a system call).
``access_log.sample`` writes that share of the lines, and every error (status 400 and above)
whatever the share. With ``route_headers: true``, ``route_headers`` (an
``on_response_prepare`` hook) adds ``x-kvrouter-engine`` and ``x-kvrouter-overlap-tokens`` to
the answer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from collections.abc import Callable, Container
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from router.core.verdict import Decision
from router.gateway.config.access_log import AccessLogSettings
from router.gateway.quality import RoutingQuality

ACCESS_LOGGER = "kvrouter.access"
ENGINE_HEADER = "x-kvrouter-engine"
OVERLAP_HEADER = "x-kvrouter-overlap-tokens"
MAX_MODEL_CHARS = 200  # a model name is the client's text: long enough for any real one

log = logging.getLogger(ACCESS_LOGGER)


class Receipt:
    """One request's account, filled along its exchange."""

    __slots__ = (
        "admitted_at",
        "answered_at",
        "attempts",
        "decision",
        "engine",
        "model",
        "queued_at",
        "request_id",
        "route",
        "t0",
        "tenant",
        "usage",
    )

    def __init__(self, request_id: str, route: str, t0: float) -> None:
        self.request_id = request_id
        self.route = route
        self.t0 = t0
        self.tenant: str | None = None
        self.model: str | None = None
        # Around flow control's wait: a request turned away (429) waited until it was.
        self.queued_at: float | None = None
        self.admitted_at: float | None = None
        self.decision: Decision | None = None
        self.engine: str | None = None
        self.attempts = 0
        self.answered_at: float | None = None
        self.usage: tuple[int, int] | None = None  # (prompt, cached) from the engine

    def attempt(self, engine: str, n: int) -> None:
        """Attempt ``n`` goes to ``engine``."""
        self.engine, self.attempts = engine, n

    def believed(self) -> int:
        """Prompt tokens the engine of the last attempt was believed to hold."""
        d = self.decision
        if d is None or self.engine is None:
            return 0
        return d.believed_tokens(d.overlap_of(self.engine))

    def queue_wait_ms(self, now: float) -> float | None:
        """Time in flow control's queue (None: the request never reached it)."""
        if self.queued_at is None:
            return None
        end = now if self.admitted_at is None else self.admitted_at
        return _ms(end - self.queued_at)

    def path(self, status: int) -> str:
        if not self.attempts:
            return "rejected"
        if status >= 500 and status != 499:
            return "failed"
        return "routed" if self.attempts == 1 else "retry"

    def line(
        self, status: int, now: float, not_deepest: str | None, reachable: int | None
    ) -> dict[str, Any]:
        """The access-log record (``not_deepest`` and ``reachable``: the decision's)."""
        d = self.decision
        usage = self.usage
        answered = self.answered_at
        return {
            "request_id": self.request_id,
            "route": self.route,
            "status": status,
            "tenant": self.tenant,
            "model": self.model[:MAX_MODEL_CHARS] if self.model is not None else None,
            "engine": self.engine,
            "path": self.path(status),
            "attempts": self.attempts,
            "queue_wait_ms": self.queue_wait_ms(now),
            "ttft_ms": None if answered is None else _ms(answered - self.t0),
            "duration_ms": _ms(now - self.t0),
            "prompt_tokens": usage[0] if usage else (d.prompt_tokens if d else None),
            "believed": self.believed() if d else None,
            "reachable": reachable,
            "cached_tokens": usage[1] if usage else None,
            "not_deepest": not_deepest,
            "divergence_block": d.divergence_block if d else None,
            "prefix_broken_at": d.prefix_broken() if d else None,
        }


def _ms(seconds: float) -> float:
    """Milliseconds to the microsecond (``round(x, 3)`` costs several times as much)."""
    return int(seconds * 1_000_000 + 0.5) / 1000


class Receipts:
    """Where receipts end: the routing-quality counters and the access log."""

    def __init__(
        self,
        settings: AccessLogSettings,
        quality: RoutingQuality,
        precise: Container[str] = (),
        chance: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.quality = quality
        self.precise = precise  # engines whose KV events the index holds
        self._chance = chance
        self._lines: list[str] = []  # written at the end of this turn of the event loop

    def close(self, r: Receipt, status: int, now: float) -> None:
        """Count ``r``'s request and write its line (if sampled)."""
        d = r.decision
        reason = reach = None
        if d is not None:
            reason, reach = d.not_deepest, d.believed_tokens(d.reachable)
            self.quality.decided(reason)
            if r.usage is not None and r.engine is not None:
                mode = "precise" if r.engine in self.precise else "approximate"
                self.quality.answered(r.engine, mode, reach, r.believed(), r.usage[1])
        s = self.settings
        if not s.enabled or not log.isEnabledFor(logging.INFO):
            return
        if status < 400 and (s.sample <= 0 or (s.sample < 1 and self._chance() >= s.sample)):
            return
        line = orjson.dumps(r.line(status, now, reason, reach)).decode()
        if not self._lines:
            try:
                asyncio.get_running_loop().call_soon(self._flush)
            except RuntimeError:  # no loop: nothing to wait for
                sys.stderr.write(line + "\n")
                return
        self._lines.append(line)

    def _flush(self) -> None:
        lines, self._lines = self._lines, []
        sys.stderr.write("\n".join(lines) + "\n")


def no_receipts() -> Receipts:
    """Receipts that are counted where nobody scrapes and never written."""
    return Receipts(AccessLogSettings(enabled=False), RoutingQuality(CollectorRegistry()))


RECEIPT = web.RequestKey("kvrouter.receipt", Receipt)


async def route_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the answer names the engine it came from and its overlap."""
    r = request.get(RECEIPT)
    if r is not None and r.engine is not None:
        response.headers[ENGINE_HEADER] = r.engine
        response.headers[OVERLAP_HEADER] = str(r.believed())
