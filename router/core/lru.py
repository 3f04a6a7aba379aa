"""A bounded, recency-ordered set of block keys.

Both the router's block index (its belief about an engine's cache) and the simulated engine's
prefix cache (the truth) use this one structure, so the belief models the truth exactly when
they see the same traffic. ``lru_keys`` makes one: the compiled ``Lru`` where the extension
runs (``router/core/hotpath-c/lru.c``: keys and times in C arrays, about 50 bytes an entry),
else ``LruKeys``, the pure-Python reference below; both have the face ``Lru`` describes.

A plain ``dict`` keeps insertion order, so re-inserting a key moves it to the most-recent end.
Eviction takes the oldest keys from the front in batches: a dict leaves a dummy slot for every
deleted key until it resizes, and one scan per batch (instead of per key) keeps the cost of
skipping those dummies amortised to a few nanoseconds per insert. A plain dict costs about
42 bytes per key here, against about 91 for ``collections.OrderedDict``.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from itertools import islice
from typing import Protocol

from router.core import hotpath

# Evict this fraction of capacity at once when full: the set holds between
# (1 - 1/EVICT_BATCH_DIVISOR) x capacity and capacity keys in steady state.
EVICT_BATCH_DIVISOR = 64


class Lru(Protocol):
    """What both implementations offer (``LruKeys`` documents each operation)."""

    capacity: int

    @property
    def ttl(self) -> float | None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, key: object) -> bool: ...
    def keys(self) -> Container[int]: ...
    def items(self) -> list[tuple[int, float]]: ...
    def table(self) -> Container[int]: ...
    def touch(self, keys: Sequence[int], now: float, /) -> list[int]: ...
    def touch_chain(self, chain: Sequence[int], now: float, /) -> list[int]: ...
    def evict(self, count: int, /) -> list[int]: ...
    def expire(self, now: float, /) -> list[int]: ...
    def discard(self, keys: Iterable[int], /) -> list[int]: ...
    def clear(self) -> None: ...
    def evicted_age(self, count: int, now: float, /) -> float | None: ...
    def leading_since(self, keys: Sequence[int], since: float, /) -> int: ...
    def leading(self, keys: Sequence[int], now: float | None = None, /) -> int: ...


def lru_keys(capacity: int, ttl: float | None = None) -> Lru:
    """An empty set: the compiled one where the extension runs (keys must then be 64-bit
    unsigned, as block keys are), else the reference."""
    native = hotpath.native
    return LruKeys(capacity, ttl) if native is None else native.Lru(capacity, ttl)


class LruKeys:
    """Keys in recency order with a capacity and an optional age limit: the reference.

    The value stored per key is the time it was last touched; callers pass the time in.
    """

    __slots__ = ("_keys", "capacity", "ttl")

    def __init__(self, capacity: int, ttl: float | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.ttl = ttl
        self._keys: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def keys(self) -> Container[int]:
        """A live, read-only view of the keys: membership probes on hot paths run in C."""
        return self._keys.keys()

    def items(self) -> list[tuple[int, float]]:
        """(key, time last touched) pairs, least recently touched first."""
        return list(self._keys.items())

    def table(self) -> dict[int, float]:
        """The live table (key -> time last touched), which the compiled overlaps walk probes
        when an index made by the reference meets the compiled code; read it only."""
        return self._keys

    def touch(self, keys: Sequence[int], now: float) -> list[int]:
        """Insert or refresh ``keys`` (the last one ends most recent); return the evicted keys."""
        return self._touch(keys, now, False)

    def touch_chain(self, chain: Sequence[int], now: float) -> list[int]:
        """Insert or refresh a chain of block keys (first block first); return the evicted keys.

        Deepest block first, so the chain's head ends most recent: like an engine, the set then
        forgets the tail of a prefix before its head, and ``leading`` may assume the blocks
        held form a prefix.
        """
        return self._touch(chain, now, True)

    def _touch(self, keys: Sequence[int], now: float, reverse: bool) -> list[int]:
        d = self._keys
        pop = d.pop
        for k in reversed(keys) if reverse else keys:
            pop(k, None)
            d[k] = now
        if len(d) > self.capacity:
            return self.evict(len(d) - self.capacity + self.capacity // EVICT_BATCH_DIVISOR)
        return []

    def evict(self, count: int) -> list[int]:
        """Remove and return up to ``count`` of the least recently touched keys."""
        d = self._keys
        victims = list(islice(d, count))
        for k in victims:
            del d[k]
        return victims

    def expire(self, now: float) -> list[int]:
        """Remove and return the keys untouched for longer than the age limit."""
        if self.ttl is None:
            return []
        horizon = now - self.ttl
        d = self._keys
        victims = []
        for k, t in d.items():
            if t > horizon:
                break
            victims.append(k)
        for k in victims:
            del d[k]
        return victims

    def discard(self, keys: Iterable[int]) -> list[int]:
        """Remove ``keys`` where present; return the ones that were."""
        pop = self._keys.pop
        return [k for k in keys if pop(k, None) is not None]

    def clear(self) -> None:
        self._keys.clear()

    def evicted_age(self, count: int, now: float) -> float | None:
        """How long ago the newest of the keys that ``count`` new keys would push out was
        touched; None when they evict nothing (they fit, or the cache is empty: more keys than
        it holds push out only each other)."""
        over = len(self._keys) + count - self.capacity
        if over <= 0 or not self._keys:
            return None
        t = next(islice(self._keys.values(), min(over, len(self._keys)) - 1, None), now)
        return now - t

    def leading_since(self, keys: Sequence[int], since: float) -> int:
        """How many of ``keys``, from the first, were touched after ``since`` (walked one by one:
        no chain order is assumed)."""
        d = self._keys
        n = 0
        for k in keys:
            t = d.get(k)
            if t is None or t <= since:
                break
            n += 1
        return n

    def leading(self, keys: Sequence[int], now: float | None = None) -> int:
        """How many of ``keys``, from the first, are held (and fresh when ``now`` is given).

        Chains are touched deepest block first (``touch_chain``), so within a chain the head is
        always more recent than the tail: eviction and expiry take a chain's tail before its
        head, and the blocks held form a prefix. That lets a galloping search find the first
        missing block in O(log n) probes instead of walking the whole shared prefix.
        """
        d = self._keys
        if now is None or self.ttl is None:

            def held(i: int) -> bool:
                return keys[i] in d
        else:
            horizon = now - self.ttl

            def held(i: int) -> bool:
                t = d.get(keys[i])
                return t is not None and t > horizon

        n = len(keys)
        if not n or not held(0):
            return 0
        lo, step = 0, 1  # keys[lo] is held
        while lo + step < n and held(lo + step):
            lo += step
            step *= 2
        hi = min(n, lo + step)  # keys[hi] is missing, or hi == n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if held(mid):
                lo = mid
            else:
                hi = mid
        return lo + 1
