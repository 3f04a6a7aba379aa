"""Rumours waiting to be sent, each a bounded number of times (memberlist's broadcast queue).

Every message to a peer takes the least-sent rumours first (newest first among equals), up to
a byte budget, and counts one transmission for each; a rumour leaves the queue after ``limit``
transmissions, where the node sets ``limit`` to mult x ceil(log10(N+1)). A newer rumour about
the same thing (the same key) replaces the older one. The queue is bounded: past ``max_items``
the most-sent, oldest rumours are dropped first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A take stops after this many consecutive rumours too big for what is left of the budget.
_MAX_SKIPS = 32


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    size: int


class TransmitQueue(Generic[K, V]):
    """A retransmit-limited rumour queue, bucketed by how often each rumour was sent."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.dropped = 0
        # _buckets[t]: rumours sent t times, oldest first (dicts keep insertion order).
        self._buckets: list[dict[K, _Entry[V]]] = [{}]
        self._sent: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def __contains__(self, key: object) -> bool:
        return key in self._sent

    def push(self, key: K, value: V, size: int) -> None:
        """Queue ``value`` under ``key``, replacing (and resetting) an older rumour."""
        self.discard(key)
        self._buckets[0][key] = _Entry(value, size)
        self._sent[key] = 0
        if len(self._sent) > self.max_items:
            self._drop_one()

    def discard(self, key: K) -> None:
        t = self._sent.pop(key, None)
        if t is not None:
            del self._buckets[t][key]

    def take(self, budget: int, limit: int, keep: Callable[[V], bool] | None = None) -> list[V]:
        """Rumours for one message: least-sent first, within ``budget`` bytes.

        ``keep`` may reject a rumour that has gone stale; it is dropped from the queue.
        """
        picked: list[tuple[int, K, V]] = []
        stale: list[K] = []
        skips = 0
        for t, bucket in enumerate(self._buckets):
            for key in reversed(bucket):
                entry = bucket[key]
                if keep is not None and not keep(entry.value):
                    stale.append(key)
                    continue
                if entry.size > budget:
                    skips += 1
                    if skips >= _MAX_SKIPS:
                        break
                    continue
                budget -= entry.size
                picked.append((t, key, entry.value))
            if skips >= _MAX_SKIPS or budget <= 0:
                break
        for key in stale:
            self.discard(key)
        for t, key, _ in picked:
            entry = self._buckets[t].pop(key)
            if t + 1 >= limit:
                del self._sent[key]
                continue
            if t + 1 == len(self._buckets):
                self._buckets.append({})
            self._buckets[t + 1][key] = entry
            self._sent[key] = t + 1
        return [value for _, _, value in picked]

    def _drop_one(self) -> None:
        for bucket in reversed(self._buckets):
            if bucket:
                key = next(iter(bucket))
                del bucket[key]
                del self._sent[key]
                self.dropped += 1
                return
