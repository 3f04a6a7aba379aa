"""Flow control: when the fleet is full, requests wait in a bounded queue, not on an engine.

``Admission.enter`` lets a request through at once while one of its candidate engines has
room and nobody waits before it; otherwise it queues (router.core.admission: priority, then
turns between tenants, then FIFO) until an engine has room, its client leaves (it leaves the
queue at once), or ``max_wait_seconds`` pass. A full queue or too long a wait is a 429 with
``Retry-After`` in the OpenAI shape, never a 5xx.

An engine has room while its in-flight requests (every replica's, from the core's load book)
are under ``max_inflight_per_engine``, when that is set (less ``priority_reserve`` for requests
of priority 0 and above, so urgent ones find a free slot), and while nothing says it is full
(``engine_full``: the engine's own metrics, e.g. requests waiting inside it). With neither
signal, flow control never holds a request back.

``Exchange`` calls ``enter`` before deciding and ``leave`` after releasing its load; ``pump``
also runs on a timer, for room that appears without a request ending (an engine's report).
A woken request is counted as pending until it resumes and takes its load (no await lies
between the two), so one free slot wakes one request, not the whole queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.core.admission import AdmissionQueue, Waiter
from router.core.decision import RoutingCore
from router.gateway.config.serving import FlowControl
from router.gateway.metrics import Metrics
from router.gateway.openai.errors import BadRequest, TooBusy

log = logging.getLogger(__name__)

PRIORITY_RANGE = (-1_000_000, 1_000_000)
DEFAULT_TENANT = "-"
# How often the queue looks for room that no ending request announced.
PUMP_SECONDS = 0.05

_Slot = tuple["asyncio.Future[None]", tuple[str, ...]]


def priority_of(body: Mapping[str, Any], headers: Mapping[str, str], header: str) -> int:
    """The request's priority: the header, else the body's ``priority`` (vLLM's), else 0."""
    raw: object = headers.get(header)
    where = header
    if raw is None:
        raw, where = body.get("priority", 0), "priority"
    try:
        value = int(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = None
    lo, hi = PRIORITY_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{where} must be an integer from {lo} to {hi}", param=where)
    return value


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()


def tenant_of(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    header: str,
    key_name: str | None = None,
) -> str:
    """Who the request belongs to: its authenticated key's name, else the tenant header, else
    its API key, else ``user``.

    A key's name wins over the header (a client must not pick its own share). Keys and user
    strings are digested: a tenant is a bounded label, never a secret.
    """
    if key_name is not None:
        return key_name
    named = headers.get(header)
    if named:
        return named[:128]
    scheme, _, key = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return "key:" + _digest(key.strip())
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + _digest(user)
    return DEFAULT_TENANT


class Admission:
    """The gate in front of the decision: through at once, or queued, or a 429."""

    def __init__(
        self,
        rules: FlowControl,
        core: RoutingCore,
        metrics: Metrics,
        *,
        engine_full: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rules = rules
        self._core = core
        self._metrics = metrics
        self._engine_full = engine_full or self._reported_full
        self._clock = clock
        self._queue: AdmissionQueue[_Slot] = AdmissionQueue(rules.max_queue)
        self._pending = 0  # woken, not yet resumed

    def _reported_full(self, engine: str) -> bool:
        """The engine's own fresh report says it is full (see FlowControl's thresholds)."""
        now = self._clock()
        r = self._core.loads.engine_reported(engine, now)
        if r is None:
            return False
        w, kv = self.rules.engine_waiting_threshold, self.rules.engine_kv_usage_threshold
        return bool(
            (w and (self._core.loads.queued(engine, now) or 0) >= w) or (kv and r.kv_usage >= kv)
        )

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def depth(self) -> dict[int, int]:
        return self._queue.depth()

    def room(self, candidates: Sequence[str], priority: int = 0) -> float:
        """Requests of ``priority`` that ``candidates`` can still take (inf: no limit applies)."""
        cap = self.rules.max_inflight_per_engine
        if cap and priority >= 0:
            cap = max(1, cap - self.rules.priority_reserve)
        total = 0.0
        for e in candidates:
            if self._engine_full(e):
                continue
            if not cap:
                return math.inf
            total += max(0, cap - self._core.loads.total(e).requests)
        return total

    async def enter(self, candidates: Sequence[str], priority: int, tenant: str) -> None:
        """Return when the request may go; raises ``TooBusy`` (429) when it may not."""
        m = self._metrics
        if not self.rules.enabled or (
            not self._queue and not self._pending and self.room(candidates, priority) > 0
        ):
            m.admitted.labels("immediate").inc()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        w = Waiter(priority, tenant, self._clock(), (fut, tuple(candidates)))
        if not self._queue.push(w):
            m.rejected.labels("queue_full").inc()
            raise TooBusy(
                "the fleet is full and so is the wait queue", self.rules.retry_after_seconds
            )
        # It may go first in line and find room others could not (a slot kept for urgent
        # requests): let it go now rather than at the next request's end or the next timer.
        self.pump()
        t0 = self._clock()
        try:
            async with asyncio.timeout(self.rules.max_wait_seconds):
                await fut
        except TimeoutError:
            self._give_up(w)
            m.rejected.labels("timeout").inc()
            msg = f"the fleet stayed full for {self.rules.max_wait_seconds:g}s"
            raise TooBusy(msg, self.rules.retry_after_seconds) from None
        except asyncio.CancelledError:
            self._give_up(w)  # the client left
            raise
        finally:
            m.queue_wait.observe(self._clock() - t0)
        self._pending -= 1
        m.admitted.labels("queued").inc()

    def _give_up(self, w: Waiter[_Slot]) -> None:
        """``w`` will not go: out of the queue, or, woken already, its slot handed on.

        A waiter cancelled while queued may have been dropped by ``pump`` already (its future
        was done); only one that was woken holds a pending slot to hand on.
        """
        fut = w.payload[0]
        if not self._queue.remove(w) and fut.done() and not fut.cancelled():
            self._pending -= 1
            self.pump()

    async def pump_loop(self, interval: float = PUMP_SECONDS) -> None:
        """Pump on a timer too: room also appears when an engine's report changes."""
        while True:
            await asyncio.sleep(interval)
            self.pump()

    def leave(self) -> None:
        """A request released its load: room for the next in line, maybe."""
        if self._queue:
            self.pump()

    def pump(self) -> None:
        """Wake waiters, best first, while their engines have room for them."""
        while self._queue:
            head = self._queue.peek()
            assert head is not None
            fut, candidates = head.payload
            if fut.done():  # timed out or cancelled meanwhile; its own handler removes it
                self._queue.remove(head)
                continue
            if self.room(candidates, head.priority) - self._pending <= 0:
                return
            self._queue.pop()
            self._pending += 1
            fut.set_result(None)
