"""A stop that keeps its promise: requests in flight get the grace period, and no more.

On SIGTERM the gateway stops accepting connections, ``/ready`` answers 503 and every answer
carries ``Connection: close``, so clients and load balancers move to other replicas. Requests
already in flight go on; when the last one ends the process exits. At ``drain.grace_seconds``
whatever still runs is cut short: every wait on an engine is cancelled through its attempt's
``Deadline``, a stream ends with an SSE error event saying the gateway is shutting down (code
``server_shutting_down``) and a request without an answer yet gets a 503 with Retry-After, so
the client knows to retry elsewhere instead of seeing a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from router.gateway.upstream.deadline import Deadline

log = logging.getLogger(__name__)

# After the grace period, how long the cut requests get to write their last bytes.
CUT_SECONDS = 1.0


class Drain:
    """The exchanges in flight and their waits on engines; the cut at the end of the grace."""

    __slots__ = ("_idle", "_in_flight", "_waits", "cut", "started")

    def __init__(self) -> None:
        self.started = False  # SIGTERM came: readiness false, connections close after answers
        self.cut = False  # the grace period is over: waits on engines end at once
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._waits: set[Deadline] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        """The body of one exchange: counted until it ends."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def watch(self, deadline: Deadline) -> None:
        """An attempt's waits on its engine, cut at the end of the grace period."""
        if self.cut:
            deadline.cut()
        self._waits.add(deadline)

    def forget(self, deadline: Deadline) -> None:
        """The attempt is over."""
        self._waits.discard(deadline)

    async def run(self, grace_seconds: float, clock: Callable[[], float]) -> None:
        """Wait until nothing is in flight, at most ``grace_seconds``; then cut what is left."""
        self.started = True
        start = clock()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_seconds):
                await self._idle.wait()
        if not self._in_flight:
            log.info("drained in %.3gs", clock() - start)
            return
        log.warning(
            "grace period of %gs over: cutting %d request(s) still in flight",
            grace_seconds,
            self._in_flight,
        )
        self.cut = True
        for deadline in list(self._waits):
            deadline.cut()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CUT_SECONDS):
                await self._idle.wait()
