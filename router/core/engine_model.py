"""A model of one inference engine: its prefix cache and its timing.

The simulator replays traces through it and ``kvrouter engine-sim`` serves real HTTP with it,
so a result in simulation is a result the live demo can reproduce.

Timing (continuous batching, FCFS, no preemption): a request waits for one of ``max_batch``
slots; its prefill, of the prompt tokens not already in the prefix cache, runs at
``prefill_tokens_per_s`` and prefills run one at a time (prefill is compute-bound); then it
decodes at ``decode_tokens_per_s`` per sequence, in parallel with the other slots (decode is
memory-bound, and a batch step costs about the same as one sequence). Because admission is FCFS
and prefills are serialised, a request's whole schedule is known when it arrives, and every
earlier request on the same engine has finished its prefill (so its blocks are cached) before
this one starts: inserting blocks at arrival is exact, not an approximation.

What the engine reports of itself (``Occupancy``, vLLM's gauges): requests running (prefill
begun, not finished), requests waiting (arrived, prefill not begun), and the share of its KV
cache that running requests hold: each one's uncached prompt and the tokens it has generated,
plus the longest cached prefix among them once (requests that hit share those blocks).

Defaults describe a mid-size model (about 8B parameters) on one data-centre GPU: ~10k tokens/s of
prefill, ~40 tokens/s per sequence of decode at moderate batch, 32 slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from router.core.lru import LruKeys


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine's capacity and speed."""

    capacity_tokens: int = 400_000
    block_tokens: int = 16
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 40.0
    max_batch: int = 32

    def __post_init__(self) -> None:
        if self.capacity_tokens < self.block_tokens or self.block_tokens < 1:
            raise ValueError("capacity_tokens must hold at least one block of block_tokens >= 1")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("prefill and decode rates must be positive")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return uncached_tokens / self.prefill_tokens_per_s

    def decode_seconds(self, output_tokens: int) -> float:
        return output_tokens / self.decode_tokens_per_s

    def pooled(self, engines: int) -> EngineSpec:
        """One engine with the cache, prefill compute and slots of ``engines`` engines."""
        return EngineSpec(
            capacity_tokens=self.capacity_tokens * engines,
            block_tokens=self.block_tokens,
            prefill_tokens_per_s=self.prefill_tokens_per_s * engines,
            decode_tokens_per_s=self.decode_tokens_per_s,
            max_batch=self.max_batch * engines,
        )


class PrefixCache:
    """An engine's prefix cache: full blocks of ``block_tokens``, LRU within a token budget."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks = LruKeys(max(1, capacity_tokens // block_tokens))

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def tokens(self) -> int:
        return len(self._blocks) * self.block_tokens

    def lookup_and_insert(self, keys: Sequence[int], prompt_tokens: int, now: float) -> int:
        """Cached tokens of a prompt whose full blocks are ``keys``; then cache them all."""
        return self.admit(keys, prompt_tokens, now)[0]

    def admit(self, keys: Sequence[int], prompt_tokens: int, now: float) -> tuple[int, list[int]]:
        """``lookup_and_insert``, and the keys that caching the prompt evicted (what an engine
        announces in its ``BlockRemoved`` events)."""
        hit = self._blocks.leading(list(keys)) * self.block_tokens
        evicted = self._blocks.touch_chain(keys, now)
        # An engine always computes at least the last prompt token to produce the first output.
        return min(hit, max(0, prompt_tokens - 1)), evicted

    def clear(self) -> None:
        self._blocks.clear()


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a request's prefill starts, its first token appears, and it finishes."""

    arrival: float
    prefill_start: float
    first_token: float
    done: float

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival


@dataclass(slots=True)
class EngineClock:
    """FCFS slots and a serial prefill unit; ``admit`` returns a request's whole schedule."""

    spec: EngineSpec
    _slots_free_at: list[float] = field(default_factory=list)
    _prefill_free_at: float = 0.0
    busy_seconds: float = 0.0

    def admit(self, arrival: float, uncached_tokens: int, output_tokens: int) -> Schedule:
        slots = self._slots_free_at
        start = arrival
        if len(slots) >= self.spec.max_batch:
            start = max(start, heapq.heappop(slots))
        prefill = self.spec.prefill_seconds(uncached_tokens)
        decode = self.spec.decode_seconds(output_tokens)
        prefill_start = max(start, self._prefill_free_at)
        first = prefill_start + prefill
        self._prefill_free_at = first
        done = first + decode
        heapq.heappush(slots, done)
        self.busy_seconds += prefill + decode
        return Schedule(arrival, prefill_start, first, done)

    def running(self, now: float) -> int:
        """Requests admitted and not finished at ``now``."""
        return sum(1 for t in self._slots_free_at if t > now)

    def reset(self) -> None:
        self._slots_free_at.clear()
        self._prefill_free_at = 0.0
        self.busy_seconds = 0.0


def kv_in_use(held: Sequence[tuple[int, int, int]]) -> int:
    """KV tokens running requests hold, each given as (prompt, cached, generated) tokens."""
    if not held:
        return 0
    return max(c for _, c, _ in held) + sum(p - c + g for p, c, g in held)


class Occupancy:
    """The requests admitted to one engine, to report its running, waiting and KV use."""

    __slots__ = ("_items", "spec")

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._items: list[tuple[Schedule, int, int]] = []  # (schedule, prompt, cached)

    def add(self, schedule: Schedule, prompt_tokens: int, cached_tokens: int) -> None:
        self._items.append((schedule, prompt_tokens, cached_tokens))

    def report(self, now: float) -> tuple[int, int, float]:
        """(running, waiting, KV use from 0 to 1) at ``now``; forgets finished requests."""
        items = self._items = [it for it in self._items if it[0].done > now]
        rate = self.spec.decode_tokens_per_s
        held = []
        waiting = 0
        for sched, prompt, cached in items:
            if sched.prefill_start > now:
                waiting += 1
            else:
                generated = int(max(0.0, now - sched.first_token) * rate)
                held.append((prompt, cached, generated))
        return len(held), waiting, min(1.0, kv_in_use(held) / self.spec.capacity_tokens)
