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

Interference (``EngineSpec.decode_stall``, off at 0): with chunked prefill a batch step that
carries prefill work is longer for every sequence in the batch, by about the prefill compute it
carries, so a prefill of ``s`` seconds delays every sequence decoding beside it by
``decode_stall`` x ``s``. It stays computable at admission because prefills are serial and FCFS:
a new prefill interval [start, end] begins after every earlier one, so the requests it stalls are
exactly those already admitted and still running at ``start`` (one that begins decoding part-way,
its KV cache arriving by transfer, is stalled for the part it overlaps; one admitted while
prefills are queued ahead of its decode, for those). Their end times are
therefore kept mutable (``Running.done``): each admission moves them later, at most ``max_batch``
of them, and a caller waiting for one re-reads it when it falls due. No prefill starts before its
own arrival, so an end the replay has reached is final. This costs one pass over the batch per
admission and keeps the FCFS schedule exact, where stepping the batch token by token would cost
a pass per output token. The stall is charged whole even to a sequence with fewer tokens left
than the prefill has chunks (it would finish part-way, at the slower step): an overestimate
bounded by one prefill, small when chunks are large against a decode step. Time per output
token is ``Running.tpot``: (end - first token) / output tokens.

Roles: a prefill engine's request leaves at its first token (``output_tokens`` 0; its blocks stay
cached there); a decode engine that receives a transfer (``EngineClock.receive``) prefills
nothing: its first token waits for a batch slot, the prefill engine's answer, and the transfer
of the bytes it lacks over the link (links are not shared: no contention between transfers).

Defaults describe a mid-size model (about 8B parameters) on one data-centre GPU: ~10k tokens/s of
prefill, ~40 tokens/s per sequence of decode at moderate batch, 32 slots.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.core.lru import lru_keys


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine's capacity and speed."""

    capacity_tokens: int = 400_000
    block_tokens: int = 16
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 40.0
    max_batch: int = 32
    # Seconds each decoding sequence loses per second of prefill in its batch (chunked
    # prefill: about 1); 0: prefill does not slow decoding.
    decode_stall: float = 0.0

    def __post_init__(self) -> None:
        if self.capacity_tokens < self.block_tokens or self.block_tokens < 1:
            raise ValueError("capacity_tokens must hold at least one block of block_tokens >= 1")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("prefill and decode rates must be positive")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if not 0 <= self.decode_stall <= 100:
            raise ValueError("decode_stall must be from 0 to 100")

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
            decode_stall=self.decode_stall,
        )


class PrefixCache:
    """An engine's prefix cache: full blocks of ``block_tokens``, LRU within a token budget."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks = lru_keys(max(1, capacity_tokens // block_tokens))

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


class Timed(Protocol):
    """When a request's prefill starts, its first token appears, and it finishes."""

    @property
    def prefill_start(self) -> float: ...
    @property
    def first_token(self) -> float: ...
    @property
    def done(self) -> float: ...


@dataclass(slots=True, eq=False)
class Running:
    """A request admitted to an engine: its schedule as admitted, and when it ends now (later
    prefills beside it move ``done`` past ``schedule.done`` when the engine models
    interference)."""

    schedule: Schedule
    output_tokens: int
    done: float

    def __lt__(self, other: Running) -> bool:
        return self.done < other.done

    @property
    def prefill_start(self) -> float:
        return self.schedule.prefill_start

    @property
    def first_token(self) -> float:
        return self.schedule.first_token

    @property
    def ttft(self) -> float:
        return self.schedule.ttft

    @property
    def tpot(self) -> float:
        """Seconds per output token from the first token on (0 for none): the model decodes
        every output token after the prefill, so an unloaded engine's is its decode step."""
        if self.output_tokens < 1:
            return 0.0
        return (self.done - self.schedule.first_token) / self.output_tokens


@dataclass(slots=True)
class EngineClock:
    """FCFS slots and a serial prefill unit; ``admit`` returns a request's whole schedule."""

    spec: EngineSpec
    _live: list[Running] = field(default_factory=list)  # a heap by end time
    _prefill_free_at: float = 0.0
    # With interference: the prefills not yet over when the latest request was admitted.
    _prefills: deque[tuple[float, float]] = field(default_factory=deque)
    busy_seconds: float = 0.0

    def admit(self, arrival: float, uncached_tokens: int, output_tokens: int) -> Schedule:
        """The request's schedule as admitted (its end as it stands now)."""
        return self.start(arrival, uncached_tokens, output_tokens).schedule

    def start(self, arrival: float, uncached_tokens: int, output_tokens: int) -> Running:
        """Admit a request that prefills its ``uncached_tokens`` here."""
        begin = self._slot(arrival)
        prefill = self.spec.prefill_seconds(uncached_tokens)
        prefill_start = max(begin, self._prefill_free_at)
        first = prefill_start + prefill
        self._prefill_free_at = first
        if self.spec.decode_stall and prefill > 0:
            self._stall(prefill_start, first)
            self._prefills.append((prefill_start, first))
        return self._run(arrival, prefill_start, first, output_tokens, prefill)

    def receive(
        self, arrival: float, kv_sent_at: float, transfer_seconds: float, output_tokens: int
    ) -> Running:
        """Admit a request whose KV cache a prefill engine sends, from ``kv_sent_at`` (its
        answer), taking ``transfer_seconds`` once this engine has a slot for it. Admissions
        come in time order: ``arrival`` is no earlier than the previous one's."""
        begin = max(self._slot(arrival), kv_sent_at)
        first = begin + transfer_seconds
        return self._run(arrival, begin, first, output_tokens, 0.0)

    def _slot(self, arrival: float) -> float:
        prefills = self._prefills
        while prefills and prefills[0][1] <= arrival:
            prefills.popleft()
        if len(self._live) >= self.spec.max_batch:
            return max(arrival, heapq.heappop(self._live).done)
        return arrival

    def _run(
        self, arrival: float, prefill_start: float, first: float, output_tokens: int, prefill: float
    ) -> Running:
        decode = self.spec.decode_seconds(output_tokens)
        sched = Schedule(arrival, prefill_start, first, first + decode)
        r = Running(sched, output_tokens, sched.done)
        # Prefills already scheduled that it will decode beside (none for a request that
        # prefills here: every earlier prefill ends before its own begins).
        f = self.spec.decode_stall
        for start, end in self._prefills:
            if end > first and start < r.done:
                r.done += f * (end - max(start, first))
        heapq.heappush(self._live, r)
        self.busy_seconds += prefill + decode
        return r

    def _stall(self, start: float, end: float) -> None:
        """A prefill over [start, end] slows every sequence decoding during it."""
        f = self.spec.decode_stall
        moved = False
        for r in self._live:
            if r.done > start and r.first_token < end:
                r.done += f * (end - max(start, r.first_token))
                moved = True
        if moved:
            heapq.heapify(self._live)

    def running(self, now: float) -> int:
        """Requests admitted and not finished at ``now``."""
        return sum(1 for r in self._live if r.done > now)

    def reset(self) -> None:
        self._live.clear()
        self._prefills.clear()
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
        self._items: list[tuple[Timed, int, int]] = []  # (schedule, prompt, cached)

    def add(self, schedule: Timed, prompt_tokens: int, cached_tokens: int) -> None:
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
