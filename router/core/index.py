"""Which engine holds which block keys: the router's belief about every engine's prefix cache.

Each engine has an ``LruKeys`` with the capacity of the engine's own cache, so the belief
forgets blocks in the order the engine evicts them. Every change made here is also returned as
a ``Delta``: the serialisable unit that gossip carries between router replicas and that KV
events from engines are translated into. Applying a delta is idempotent (each origin numbers
its deltas; a number seen before is ignored) and deltas of one origin may arrive in any order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from router.core.lru import LruKeys
from router.core.seq import SeqWindow


@dataclass(frozen=True, slots=True)
class Delta:
    """One change to one engine's blocks, numbered by the replica (or engine) that saw it."""

    origin: str
    seq: int
    engine: str
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    cleared: bool = False


@dataclass(frozen=True, slots=True)
class IndexLimits:
    """Capacity model: blocks per engine (its KV cache), optional age limit, global cap."""

    engine_capacity_blocks: int
    ttl_seconds: float | None = None
    max_entries: int = 4_000_000


class BlockIndex:
    """Per-engine block keys with LRU eviction, a global entry cap, and mergeable deltas."""

    def __init__(self, limits: IndexLimits, origin: str = "local", *, seq: int = 0) -> None:
        """An empty index; its deltas are numbered from ``seq + 1`` under ``origin``."""
        self.limits = limits
        self.origin = origin
        self._engines: dict[str, LruKeys] = {}
        # engine -> its key table, for the one membership probe per engine on every decision
        self._tables: dict[str, dict[int, float]] = {}
        self._capacity_override: dict[str, int] = {}
        self._seq = seq
        self._seen: dict[str, SeqWindow] = {}
        self._entries = 0

    # -- engines -----------------------------------------------------------------------------

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self._engines)

    def add_engine(self, engine: str, capacity_blocks: int | None = None) -> None:
        """Start tracking ``engine`` (a no-op when known; a new capacity applies at once)."""
        if capacity_blocks is not None:
            self._capacity_override[engine] = capacity_blocks
        cap = self._capacity_override.get(engine, self.limits.engine_capacity_blocks)
        lru = self._engines.get(engine)
        if lru is None:
            lru = self._engines[engine] = LruKeys(cap, self.limits.ttl_seconds)
            self._tables[engine] = lru.table
        elif lru.capacity != cap:
            lru.capacity = cap
            if len(lru) > cap:
                self._entries -= len(lru.evict(len(lru) - cap))

    def drop_engine(self, engine: str) -> None:
        """Forget ``engine`` and everything it held."""
        lru = self._engines.pop(engine, None)
        self._tables.pop(engine, None)
        self._capacity_override.pop(engine, None)
        if lru is not None:
            self._entries -= len(lru)

    @property
    def seq(self) -> int:
        """The number of the last delta this index made."""
        return self._seq

    def blocks(self, engine: str) -> int:
        lru = self._engines.get(engine)
        return len(lru) if lru is not None else 0

    def __len__(self) -> int:
        """Entries: (block, engine) pairs held."""
        return self._entries

    # -- local changes (each returns the delta to spread) -------------------------------------

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def record(self, engine: str, keys: Sequence[int], now: float) -> Delta:
        """``engine`` now holds the chain ``keys`` (a request was routed there)."""
        self._touch(engine, keys, now)
        return Delta(self.origin, self._next(), engine, added=tuple(keys))

    def predict(self, engine: str, keys: Sequence[int], now: float) -> None:
        """Hold ``keys`` for ``engine`` provisionally: no delta (see ``core.predictions``)."""
        self._touch(engine, keys, now)

    def withdraw(self, engine: str, keys: Iterable[int]) -> None:
        """Take back provisional keys that no answer confirmed: no delta, nothing was told."""
        self._discard(engine, keys)

    def remove(self, engine: str, keys: Iterable[int]) -> Delta:
        keys = tuple(keys)
        self._discard(engine, keys)
        return Delta(self.origin, self._next(), engine, removed=keys)

    def clear(self, engine: str) -> Delta:
        self._clear(engine)
        return Delta(self.origin, self._next(), engine, cleared=True)

    # -- merging -----------------------------------------------------------------------------

    def apply(self, delta: Delta, now: float) -> bool:
        """Merge a delta from another origin; False (and no change) when seen before."""
        window = self._seen.get(delta.origin)
        if window is None:
            window = self._seen[delta.origin] = SeqWindow()
        if not window.add(delta.seq):
            return False
        if delta.cleared:
            self._clear(delta.engine)
        if delta.removed:
            self._discard(delta.engine, delta.removed)
        if delta.added:
            self._touch(delta.engine, delta.added, now)
        return True

    def seen(self) -> Mapping[str, int]:
        """Per origin, the sequence number up to which every delta has been applied."""
        return {origin: w.floor for origin, w in self._seen.items()}

    # -- queries -----------------------------------------------------------------------------

    def overlaps(
        self, keys: Sequence[int], engines: Sequence[str], now: float | None = None
    ) -> list[int]:
        """For each of ``engines``, in order, how many leading blocks of ``keys`` it holds."""
        out = [0] * len(engines)
        if not keys:
            return out
        first = keys[0]
        tables = self._tables
        # Most engines do not hold the first block: one dict probe each rules them out.
        for i, e in enumerate(engines):
            t = tables.get(e)
            if t is not None and first in t:
                out[i] = self._engines[e].leading(keys, now)
        return out

    def holders(self, key: int) -> list[str]:
        return [e for e, lru in self._engines.items() if key in lru]

    # -- internals ---------------------------------------------------------------------------

    def _lru(self, engine: str) -> LruKeys:
        lru = self._engines.get(engine)
        if lru is None:
            self.add_engine(engine)
            lru = self._engines[engine]
        return lru

    def _touch(self, engine: str, keys: Sequence[int], now: float) -> None:
        lru = self._lru(engine)
        before = len(lru)
        if lru.ttl is not None:
            self._entries -= len(lru.expire(now))
            before = len(lru)
        # Deepest block first, so the leading blocks end most recent: like an engine, the
        # index then forgets the tail of a prefix before its head.
        lru.touch(keys[::-1], now)
        self._entries += len(lru) - before
        if self._entries > self.limits.max_entries:
            self._shrink()

    def _discard(self, engine: str, keys: Iterable[int]) -> None:
        lru = self._engines.get(engine)
        if lru is not None:
            self._entries -= len(lru.discard(keys))

    def _clear(self, engine: str) -> None:
        lru = self._engines.get(engine)
        if lru is not None:
            self._entries -= len(lru)
            lru.clear()

    def _shrink(self) -> None:
        # Over the global cap: take the overflow (plus slack, so this runs rarely) from the
        # engines holding the most, in proportion to what each holds.
        excess = self._entries - self.limits.max_entries + self.limits.max_entries // 64
        total = self._entries
        for lru in list(self._engines.values()):
            share = min(len(lru), -(-excess * len(lru) // total))
            if share:
                self._entries -= len(lru.evict(share))

    # -- snapshots (gossip catch-up) ---------------------------------------------------------

    def export_keys(self, engine: str) -> list[int]:
        """``engine``'s keys, least recently used first (a copy; empty when unknown)."""
        lru = self._engines.get(engine)
        return list(lru) if lru is not None else []

    def restore_keys(self, engine: str, keys: Sequence[int], now: float) -> None:
        """Merge a peer's copy of ``engine``'s keys (least recently used first)."""
        lru = self._lru(engine)
        before = len(lru)
        lru.touch(keys, now)
        self._entries += len(lru) - before
        if self._entries > self.limits.max_entries:
            self._shrink()

    def mark_seen(self, origin: str, seq: int) -> None:
        """Count every delta of ``origin`` up to ``seq`` as applied (a snapshot held them)."""
        window = self._seen.get(origin)
        if window is None:
            window = self._seen[origin] = SeqWindow()
        window.advance(seq)
