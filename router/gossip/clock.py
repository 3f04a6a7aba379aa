"""Time for the gossip layer, passed in so that tests and benches control it.

``SystemClock`` is the event loop's clock; ``SkewedClock`` another with its wall time off by a
set amount, for tests of a replica whose clock is wrong (``system_clock`` picks one).
``ManualClock`` is virtual time: sleepers wake only when ``advance`` moves the clock past their
deadline, so many replicas in one process run a minute of gossip in a fraction of a second,
the same way every time. It is every test's clock:
called, it reads ``now()``, so it also stands where the gateway takes a ``Callable[[], float]``
and its ``now()`` is the float the core takes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from router.core.fields import ConfigError

# Loop iterations given to woken tasks before the clock moves on: enough for a gossip exchange
# over the in-memory transport (a few task hand-offs) to finish at the time it started.
SETTLE_ITERATIONS = 12
# For tests only: seconds to add to a real process's gossip wall clock, so that a test can
# run a replica whose clock is wrong. Never set it in production.
TEST_SKEW_ENV = "KVROUTER_GOSSIP_TEST_CLOCK_SKEW_SECONDS"


class Clock(Protocol):
    """Monotonic time for scheduling, wall time for replay windows and lag, and sleeping."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The running event loop's monotonic clock and the system's wall clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class SkewedClock:
    """Another clock with its wall time ``skew`` seconds off: a replica whose clock is wrong,
    for tests (``system_clock``)."""

    def __init__(self, skew: float, base: Clock | None = None) -> None:
        self.skew = skew
        self.base: Clock = base or SystemClock()

    def now(self) -> float:
        return self.base.now()

    def wall(self) -> float:
        return self.base.wall() + self.skew

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)


def system_clock(environ: Mapping[str, str]) -> Clock:
    """The clock a gossip node runs on: ``SystemClock``, or, for tests only, a
    ``SkewedClock`` when ``TEST_SKEW_ENV`` names a number of seconds."""
    value = environ.get(TEST_SKEW_ENV, "").strip()
    if not value:
        return SystemClock()
    try:
        skew = float(value)
    except ValueError:
        raise ConfigError(f"{TEST_SKEW_ENV}: {value!r} is not a number of seconds") from None
    if not math.isfinite(skew):
        raise ConfigError(f"{TEST_SKEW_ENV}: {value!r} is not a number of seconds")
    return SkewedClock(skew)


class ManualClock:
    """Virtual time that moves only when ``advance`` is awaited."""

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def __call__(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper due on the way in order."""
        target = self._now + seconds
        await _settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline = self._sleepers[0][0]
            self._now = max(self._now, deadline)
            # Wake everyone due at this instant together, then let them run.
            while self._sleepers and self._sleepers[0][0] <= deadline:
                fut = heapq.heappop(self._sleepers)[2]
                if not fut.done():
                    fut.set_result(None)
            await _settle()
        self._now = target
        await _settle()

    async def run_until(self, done: Callable[[], bool], step: float, limit: float) -> bool:
        """Advance in ``step``s until ``done()`` is true or ``limit`` seconds passed."""
        waited = 0.0
        while not done():
            if waited >= limit:
                return False
            await self.advance(step)
            waited += step
        return True


async def _settle() -> None:
    for _ in range(SETTLE_ITERATIONS):
        await asyncio.sleep(0)
