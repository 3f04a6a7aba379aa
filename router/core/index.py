"""Which engine holds which block keys: the router's belief about every engine's prefix cache.

Each engine has an LRU set of keys (``core.lru``) with the capacity of the engine's own cache,
so the belief forgets blocks in the order the engine evicts them. Every change made here is also
returned as a ``Delta``: the serialisable unit that gossip carries between router replicas and
that KV events from engines are translated into. Applying a delta is idempotent (each origin
numbers its deltas; a number seen before is ignored) and deltas of one origin may arrive in any
order.


Entries have a source. *Approximate* entries are the router's belief (what it routed where);
*predicted* ones are approximate entries still provisional (``core.predictions``). *Event*
entries are an engine's own word, from its KV cache events (``core.engine_blocks``): keyed by the
router's hash over the block's token ids, kept per medium (GPU, CPU, disk, ...), and never
gossiped (every replica subscribes to the engines itself). Event entries count towards the
same global cap and are shed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import contains

from router.core import hotpath
from router.core.lru import Lru, lru_keys
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


_NOTHING: frozenset[int] = frozenset()  # the keys of an engine the index does not know


class BlockIndex:
    """Per-engine block keys with LRU eviction, a global entry cap, and mergeable deltas."""

    def __init__(self, limits: IndexLimits, origin: str = "local", *, seq: int = 0) -> None:
        """An empty index; its deltas are numbered from ``seq + 1`` under ``origin``."""
        self.limits = limits
        self.origin = origin
        self._engines: dict[str, Lru] = {}
        # engine -> what the compiled walk probes (its LRU's ``table()``), on every decision,
        # and the engines whose entries age out (their LRU's age limit).
        self._tables: dict[str, Container[int]] = {}
        self._ttls: dict[str, float] = {}
        self._capacity_override: dict[str, int] = {}
        self._seq = seq
        self._seen: dict[str, SeqWindow] = {}
        self._entries = 0
        # engine -> medium -> event keys (the engine's own word)
        self._events: dict[str, dict[str, Lru]] = {}

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
            lru = self._engines[engine] = lru_keys(cap, self.limits.ttl_seconds)
            self._tables[engine] = lru.table()
            if lru.ttl is not None:
                self._ttls[engine] = lru.ttl
        elif lru.capacity != cap:
            lru.capacity = cap
            if len(lru) > cap:
                self._entries -= len(lru.evict(len(lru) - cap))

    def drop_engine(self, engine: str) -> None:
        """Forget ``engine`` and everything it held."""
        lru = self._engines.pop(engine, None)
        self._tables.pop(engine, None)
        self._ttls.pop(engine, None)
        self._capacity_override.pop(engine, None)
        if lru is not None:
            self._entries -= len(lru)
        self.clear_events(engine)

    @property
    def seq(self) -> int:
        """The number of the last delta this index made."""
        return self._seq

    def capacity_blocks(self, engine: str) -> int:
        """How many blocks the index keeps for ``engine`` (0: not tracked)."""
        lru = self._engines.get(engine)
        return 0 if lru is None else lru.capacity

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

    def predict(self, engine: str, keys: Sequence[int], now: float) -> None:
        """Hold ``keys`` for ``engine`` provisionally: no delta (see ``core.predictions``)."""
        self._touch(engine, keys, now)

    def confirm(self, engine: str, keys: Sequence[int], now: float) -> Delta:
        """``engine`` answered the request ``predict`` placed ``keys`` for: the delta to spread.

        The entries keep the recency ``predict`` gave them, as the engine's blocks keep the
        time it admitted the request; only blocks that left the index meanwhile (a failed
        attempt withdrew them, or the cap evicted them) are put back, most recent.
        """
        lru = self._engines.get(engine)
        if lru is None or lru.leading(keys) < len(keys):
            self._touch(engine, keys, now)
        return Delta(self.origin, self._next(), engine, added=tuple(keys))

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
        native = hotpath.native
        if native is not None:
            return native.overlaps(self._tables, engines, keys, now, self._ttls)
        out = [0] * len(engines)
        if not keys:
            return out
        # The reference. Most engines do not hold the first block: one dict probe each rules
        # them out, in a loop that runs in C (map over bound methods), as it runs for every engine.
        tables = map(self._tables.get, engines, repeat(_NOTHING))
        first_held = map(contains, tables, repeat(keys[0]))
        lrus = self._engines
        for i in compress(range(len(engines)), first_held):
            out[i] = lrus[engines[i]].leading(keys, now)
        return out

    def overlap(self, engine: str, keys: Sequence[int], now: float | None = None) -> int:
        """``overlaps`` for one engine."""
        lru = self._engines.get(engine)
        return lru.leading(keys, now) if lru is not None and keys else 0

    # -- internals ---------------------------------------------------------------------------

    def _lru(self, engine: str) -> Lru:
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
        lru.touch_chain(keys, now)
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
        self.clear_events(engine)

    def _shrink(self) -> None:
        # Over the global cap: take the overflow (plus slack, so this runs rarely) from the
        # engines holding the most, in proportion to what each holds.
        excess = self._entries - self.limits.max_entries + self.limits.max_entries // 64
        total = self._entries
        tiers = [lru for media in self._events.values() for lru in media.values()]
        for lru in [*self._engines.values(), *tiers]:
            share = min(len(lru), -(-excess * len(lru) // total))
            if share:
                self._entries -= len(lru.evict(share))

    # -- event entries (an engine's own KV cache events) ------------------------------------

    def store(self, engine: str, keys: Sequence[int], medium: str, now: float) -> None:
        """``engine`` says it cached ``keys`` (a chain, first block first) in ``medium``."""
        media = self._events.setdefault(engine, {})
        lru = media.get(medium)
        if lru is None:
            # The global cap bounds event entries; the engine's removals keep them exact.
            lru = media[medium] = lru_keys(self.limits.max_entries)
        before = len(lru)
        lru.touch_chain(keys, now)
        self._entries += len(lru) - before
        if self._entries > self.limits.max_entries:
            self._shrink()

    def evict(self, engine: str, keys: Iterable[int], medium: str) -> None:
        """``engine`` says it dropped ``keys`` from ``medium``."""
        lru = self._events.get(engine, {}).get(medium)
        if lru is not None:
            self._entries -= len(lru.discard(keys))

    def clear_events(self, engine: str) -> None:
        """Forget every event entry of ``engine`` (it cleared its cache, or its feed broke)."""
        for lru in self._events.pop(engine, {}).values():
            self._entries -= len(lru)

    def event_blocks(self, engine: str | None = None) -> int:
        """Event entries of ``engine`` (of every engine when None), over all media."""
        if engine is not None:
            return sum(len(lru) for lru in self._events.get(engine, {}).values())
        return sum(len(lru) for media in self._events.values() for lru in media.values())

    def event_overlap(
        self, engine: str, keys: Sequence[int], weight: Callable[[str], float]
    ) -> tuple[int, float]:
        """Leading blocks of ``keys`` ``engine`` says it holds, and their sum of tier weights.

        A block held in several media counts with the best weight. The walk is linear: an
        engine's evictions need not take a chain's tail first, so no block is assumed.
        """
        media = self._events.get(engine)
        if not media or not keys:
            return 0, 0.0
        tables = [(lru.keys(), weight(m)) for m, lru in media.items()]
        if len(tables) == 1:
            table, w = tables[0]
            n = 0
            for k in keys:
                if k not in table:
                    break
                n += 1
            return n, n * w
        n, total = 0, 0.0
        for k in keys:
            best = max((w for t, w in tables if k in t), default=None)
            if best is None:
                break
            n += 1
            total += best
        return n, total

    def evicted_age(self, engine: str, blocks: int, now: float) -> float | None:
        """How recently used the blocks are that ``blocks`` new ones would evict at ``engine``
        (seconds; None: nothing would be evicted). Router-side belief, as every overlap is."""
        lru = self._engines.get(engine)
        return None if lru is None else lru.evicted_age(blocks, now)

    def leading_since(self, engine: str, keys: Sequence[int], since: float) -> int:
        """Leading blocks of ``keys`` in ``engine``'s approximate entries newer than ``since``."""
        lru = self._engines.get(engine)
        if lru is None:
            return 0
        return lru.leading_since(keys, since)

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
