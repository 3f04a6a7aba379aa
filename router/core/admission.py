"""The order in which waiting requests are admitted when the fleet is full (no I/O).

When no engine can take a request, the gateway holds it in a bounded queue instead of piling
it onto an engine that is already full. The queue decides who goes next:

1. priority first, with vLLM's meaning: lower is served first (default 0);
2. then fair between tenants: within one priority, tenants take turns (round-robin), so a
   tenant sending ten times more requests does not push the others back ten times further;
3. FIFO within a tenant.

``push`` refuses when the queue is full; ``expire`` hands back what waited too long; ``remove``
takes out a request whose client left. Every operation is O(1) amortised per request, apart
from the scan over the few distinct priorities in use.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Waiter(Generic[T]):
    """One queued request: its ordering keys, when it arrived, and the caller's payload."""

    priority: int
    tenant: str
    since: float
    payload: T
    queued: bool = field(default=True)


class AdmissionQueue(Generic[T]):
    """Bounded; by priority, then round-robin between tenants, then FIFO."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # priority -> tenant -> that tenant's waiters, oldest first; tenants in turn order.
        self._levels: dict[int, OrderedDict[str, deque[Waiter[T]]]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def depth(self) -> dict[int, int]:
        """Queued requests by priority (for the queue-depth gauge)."""
        return {
            p: sum(len(q) for q in tenants.values()) for p, tenants in sorted(self._levels.items())
        }

    def push(self, w: Waiter[T]) -> bool:
        """Queue ``w``; False (and nothing queued) when the queue is full."""
        if self._size >= self.capacity:
            return False
        tenants = self._levels.setdefault(w.priority, OrderedDict())
        q = tenants.get(w.tenant)
        if q is None:
            q = tenants[w.tenant] = deque()
        q.append(w)
        self._size += 1
        return True

    def peek(self) -> Waiter[T] | None:
        """The next to admit, without taking it."""
        if not self._levels:
            return None
        tenants = self._levels[min(self._levels)]
        return next(iter(tenants.values()))[0]

    def pop(self) -> Waiter[T] | None:
        """Take the next to admit: best priority, the tenant whose turn it is, its oldest."""
        if not self._levels:
            return None
        prio = min(self._levels)
        tenants = self._levels[prio]
        tenant, q = next(iter(tenants.items()))
        w = q.popleft()
        if q:
            tenants.move_to_end(tenant)  # the next tenant's turn
        else:
            del tenants[tenant]
            if not tenants:
                del self._levels[prio]
        self._size -= 1
        w.queued = False
        return w

    def remove(self, w: Waiter[T]) -> bool:
        """Take ``w`` out (its client left); False when it was not queued."""
        if not w.queued:
            return False
        tenants = self._levels[w.priority]
        q = tenants[w.tenant]
        q.remove(w)  # a tenant's own line is short next to the whole queue
        if not q:
            del tenants[w.tenant]
            if not tenants:
                del self._levels[w.priority]
        self._size -= 1
        w.queued = False
        return True

    def expire(self, now: float, max_wait: float) -> list[Waiter[T]]:
        """Take out and return every waiter queued for longer than ``max_wait``."""
        late = [
            w
            for tenants in self._levels.values()
            for q in tenants.values()
            for w in q
            if now - w.since > max_wait
        ]
        for w in late:
            self.remove(w)
        return late
