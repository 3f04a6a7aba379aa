"""The one timer behind an attempt's waits on its engine: the first byte, then each read."""

from __future__ import annotations

import asyncio


class Deadline:
    """The one timer behind an attempt's waits on its engine: the first byte, then each read.

    ``asyncio.timeout`` around every read creates and cancels a timer per chunk. Here a wait
    only moves ``at`` forward, and the timer, when it fires before the deadline in force,
    re-arms itself for it: a stream gets one timer per idle period, not one per chunk. The
    timer is first armed for the ``shortest`` wait the attempt will make, so that moving from
    a long first-byte limit to a shorter idle limit needs no new timer either. When a wait
    outlives its deadline the task is cancelled, and ``expired`` tells that cancellation from
    any other (a client that left), the way ``asyncio.timeout`` does.
    """

    __slots__ = (
        "_cancelled",
        "_cancelling",
        "_handle",
        "_handle_at",
        "_loop",
        "_shortest",
        "_task",
        "_waiting",
        "at",
        "was_cut",
    )

    def __init__(self, shortest: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "a Deadline guards the task that creates it"
        self._task = task
        self._loop = task.get_loop()
        self._shortest = shortest
        self._cancelling = task.cancelling()
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0.0
        self._waiting = False
        self._cancelled = False  # this deadline cancelled the task
        self.was_cut = False  # the gateway is stopping: every wait ends at once
        self.at = 0.0

    def start(self, seconds: float) -> None:
        """A wait begins that may last ``seconds``; call ``stop`` when it ends."""
        now = self._loop.time()
        self.at = at = now if self.was_cut else now + seconds
        self._waiting = True
        if self._handle is not None:
            if self._handle_at <= at:
                return  # fires first, then re-arms for ``at``
            self._handle.cancel()
        self._handle_at = first = min(at, now + self._shortest)
        self._handle = self._loop.call_at(first, self._fire)

    def stop(self) -> None:
        """The wait ended (with bytes, an error or a cancellation)."""
        self._waiting = False

    def expired(self) -> bool:
        """On a CancelledError: True when this deadline cancelled the task, and nothing else."""
        if not self._cancelled:
            return False
        self._cancelled = False
        return self._task.uncancel() <= self._cancelling

    def cut(self) -> None:
        """End the wait in progress now, and any later one at once (``expired`` says so)."""
        self.was_cut = True
        if self._waiting and not self._cancelled:
            self._cancelled = True
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        if not self._waiting:
            return  # nothing to cut short; the next wait arms a timer again
        if self._loop.time() < self.at:
            self._handle = self._loop.call_at(self.at, self._fire)
            self._handle_at = self.at
            return
        self._cancelled = True
        self._task.cancel()
