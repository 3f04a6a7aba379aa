"""One simulated engine's state: its prefix cache, its clock, its counters and a pending fault.

The cache and the timing are the offline simulator's engine model
(``router.core.engine_model``); this class adds what a served engine has on top: wall-clock
admission (``now`` is injected, so tests drive it), the requests in flight (vLLM's running and
waiting gauges, and its KV use: the blocks running requests hold, ``engine_model.kv_in_use``;
a prefix cache full of finished requests' blocks is reusable, not in use), totals for
``/stats`` and ``/metrics``, and the fault the next requests play.
Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from router.core.engine_model import EngineClock, EngineSpec, PrefixCache, Schedule, kv_in_use
from router.enginesim.disagg_wire import RoleSettings

if TYPE_CHECKING:
    from router.enginesim.kv_publisher import EventSettings
    from router.local_tokenizer import LocalTokenizer

DEFAULT_MODEL = "sim-model"

# How the engine learns a client has gone (router.enginesim.cancel).
EngineKind = Literal["vllm", "sglang"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "sglang")

FaultMode = Literal["status", "hang", "drop-mid-stream"]
FAULT_MODES: tuple[FaultMode, ...] = ("status", "hang", "drop-mid-stream")
# ``/stats`` lists the traceparent headers of this many latest generation requests.
TRACEPARENTS_KEPT = 32


@dataclass(frozen=True, slots=True)
class SimSettings:
    """What one simulated engine serves and how fast."""

    model: str = DEFAULT_MODEL
    spec: EngineSpec = field(default_factory=EngineSpec)
    fast: bool = False
    # Publish KV cache events (router.enginesim.kv_publisher); None: no events.
    events: EventSettings | None = None
    # Every route wants ``Authorization: Bearer api_key`` (empty: none does).
    api_key: str = ""
    # A model's tokenizer: prompts are its ids (router.enginesim.tokens); None: text pieces.
    tokenizer: LocalTokenizer | None = None
    # vllm: a closed connection stops a request; sglang: only its abort (or its end) does.
    # It is also the disaggregation protocol the engine speaks (router.enginesim.disagg).
    kind: EngineKind = "vllm"
    roles: RoleSettings = field(default_factory=RoleSettings)


@dataclass(slots=True)
class Counters:
    """Totals since start or the last reset."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tokenize_requests: int = 0  # POST /tokenize calls: a router's round trips for token ids
    # Tokens generated after the request's connection closed (router.enginesim.cancel).
    tokens_after_disconnect: int = 0
    aborted: int = 0  # requests stopped by POST /abort_request
    disconnected: int = 0  # requests whose connection closed before their end
    # Generation requests by their path through a disaggregated fleet (router.enginesim.disagg).
    whole: int = 0
    prefilled_for_remote: int = 0
    decoded_from_remote: int = 0
    # KV moved to this engine from a prefill engine, and the simulated time on the link.
    transferred_tokens: int = 0
    transferred_bytes: int = 0
    transfer_seconds: float = 0.0
    transfer_failures: int = 0  # KV that could not be had from, or given to, the other side
    kv_expired: int = 0  # prefills whose held blocks nobody pulled in time


@dataclass(slots=True)
class Ticket:
    """One admitted request: its schedule, its cache hit, and how many tokens it has sent."""

    rid: int
    cached: int
    schedule: Schedule
    emitted: int = 0


@dataclass(frozen=True, slots=True)
class Fault:
    """A pending injected fault: what happens to the next ``count`` generation requests (of
    every ``every``-th one: 2 fails every other request, the others served normally)."""

    mode: FaultMode
    count: int = 1
    status: int = 503
    every: int = 1
    skipped: int = 0  # requests served since the fault last played

    def described(self) -> dict[str, Any]:
        """The fault as ``POST /fault`` echoes it."""
        out: dict[str, Any] = {"mode": self.mode, "count": self.count}
        if self.mode == "status":
            out["status"] = self.status
        if self.every != 1:
            out["every"] = self.every
        return out


class Engine:
    """The engine's mutable state: prefix cache, clock, counters, in-flight requests, fault."""

    def __init__(self, settings: SimSettings, now: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.now = now
        spec = settings.spec
        self.cache = PrefixCache(spec.capacity_tokens, spec.block_tokens)
        self.clock = EngineClock(spec)
        self.counters = Counters()
        self.fault: Fault | None = None
        self.started = int(time.time())
        self._inflight: dict[int, Schedule] = {}
        self._prompts: dict[int, tuple[int, int]] = {}  # in flight: (prompt, cached) tokens
        # Test hook (POST /load): requests reported waiting on top of the real ones, as if
        # other clients queued them.
        self.extra_waiting = 0
        # Requests waiting for their KV from (or their decode side at) another engine: queued
        # like any waiting request (router.enginesim.disagg).
        self.pd_waiting = 0
        self._ids = itertools.count()
        # The W3C trace contexts the latest generation requests came with, newest last, so a
        # test can see which span a router made the engine's parent.
        self.traceparents: deque[str] = deque(maxlen=TRACEPARENTS_KEPT)

    def admit(
        self, keys: Sequence[int], prompt_tokens: int, output_tokens: int, transferred: int = 0
    ) -> Ticket:
        """Look the prompt up in the cache (then cache it), schedule it, count it.

        ``transferred``: prompt tokens whose KV came from another engine; they are cached
        like the rest, and not prefilled here.
        """
        now = self.now()
        cached = self.cache.lookup_and_insert(keys, prompt_tokens, now)
        if self.settings.fast:
            schedule = Schedule(now, now, now, now)
        else:
            uncached = max(0, prompt_tokens - cached - transferred)
            schedule = self.clock.admit(now, uncached, output_tokens)
        c = self.counters
        c.requests += 1
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += cached
        ticket = Ticket(next(self._ids), cached, schedule)
        self._inflight[ticket.rid] = schedule
        self._prompts[ticket.rid] = (prompt_tokens, cached)
        return ticket

    def held_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """The prompt tokens the cache holds now, without caching the prompt (a decode engine
        pulls the rest); like admission, the last token is always computed."""
        # A look-up alone: PrefixCache offers it only with the insertion.
        hit = self.cache._blocks.leading(list(keys)) * self.cache.block_tokens
        return min(hit, max(0, prompt_tokens - 1))

    def release(self, ticket: Ticket) -> None:
        """Forget a finished, failed or abandoned request; count the tokens it did send."""
        # The clock keeps an abandoned request's slot until its planned end (it has no abort),
        # but the running and waiting gauges follow the requests actually in flight.
        self._prompts.pop(ticket.rid, None)
        if self._inflight.pop(ticket.rid, None) is not None:
            self.counters.completion_tokens += ticket.emitted

    def load(self) -> tuple[int, int]:
        """In-flight requests as (running, waiting): waiting ones have not begun prefill."""
        now = self.now()
        waiting = sum(1 for s in self._inflight.values() if s.prefill_start > now)
        return len(self._inflight) - waiting, waiting + self.extra_waiting + self.pd_waiting

    def cache_usage(self) -> float:
        """The share of the KV cache running requests hold, from 0 to 1 (vLLM's meaning)."""
        now = self.now()
        rate = self.settings.spec.decode_tokens_per_s
        held = [
            (*self._prompts[rid], int(max(0.0, now - s.first_token) * rate))
            for rid, s in self._inflight.items()
            if s.prefill_start <= now
        ]
        return min(1.0, kv_in_use(held) / self.settings.spec.capacity_tokens)

    def take_fault(self) -> Fault | None:
        """The fault for the request arriving now, if one is pending; uses up one count."""
        fault = self.fault
        if fault is None:
            return None
        if fault.skipped + 1 < fault.every:
            self.fault = dataclasses.replace(fault, skipped=fault.skipped + 1)
            return None
        left = dataclasses.replace(fault, count=fault.count - 1, skipped=0)
        self.fault = left if fault.count > 1 else None
        return fault

    def reset(self) -> None:
        """Empty the cache, the clock and the counters (in-flight requests run on)."""
        self.cache.clear()
        self.clock.reset()
        self.counters = Counters()
        self.traceparents.clear()

    def stats(self) -> dict[str, Any]:
        """Counters and gauges as JSON-ready values (``GET /stats``)."""
        c = self.counters
        running, waiting = self.load()
        spec = self.settings.spec
        return {
            "model": self.settings.model,
            "requests": c.requests,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "completion_tokens": c.completion_tokens,
            "tokenize_requests": c.tokenize_requests,
            "tokens_after_disconnect": c.tokens_after_disconnect,
            "aborted": c.aborted,
            "disconnected": c.disconnected,
            "kind": self.settings.kind,
            "role": self.settings.roles.role,
            "whole": c.whole,
            "prefilled_for_remote": c.prefilled_for_remote,
            "decoded_from_remote": c.decoded_from_remote,
            "transferred_tokens": c.transferred_tokens,
            "transferred_bytes": c.transferred_bytes,
            "transfer_seconds": c.transfer_seconds,
            "transfer_failures": c.transfer_failures,
            "kv_expired": c.kv_expired,
            "cache_hit_ratio": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "running": running,
            "waiting": waiting,
            "cache_tokens": self.cache.tokens,
            "cache_capacity_tokens": spec.capacity_tokens,
            "block_tokens": spec.block_tokens,
            "fast": self.settings.fast,
            "traceparents": list(self.traceparents),
        }
