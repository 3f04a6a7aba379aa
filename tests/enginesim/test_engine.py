"""The engine's state: prefix cache in tokens, counters, in-flight gauges and faults.

Requests are read with the real parser and admitted on a clock the test moves.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.core.engine_model import EngineSpec
from router.enginesim.engine import Engine, Fault, SimSettings, Ticket
from router.enginesim.requests import Endpoint, parse_generation
from tests.enginesim.support import MODEL, chat, completion, prompt, raw


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(fast: bool = True, clock: Clock | None = None, **spec: Any) -> Engine:
    settings = SimSettings(spec=EngineSpec(**{"block_tokens": 4, **spec}), fast=fast)
    return Engine(settings, clock or Clock())


def admit(engine: Engine, body: dict[str, Any], max_tokens: int = 1) -> Ticket:
    endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS
    gen = parse_generation(raw(body), endpoint, engine.settings)
    ticket = engine.admit(gen.keys, gen.prompt_tokens, max_tokens)
    engine.release(ticket)
    return ticket


def test_cached_tokens_grow_on_repeated_prefix_zero_after_reset() -> None:
    engine = make()
    hits = [admit(engine, completion(prompt(n))).cached for n in (40, 40, 50)]
    stats = engine.stats()
    engine.reset()
    after_reset = admit(engine, completion(prompt(40))).cached
    # A repeat hits all but the last token (an engine recomputes it to produce the first
    # output); a longer prompt hits the whole shared prefix.
    assert hits == [0, 39, 40]
    assert (stats["requests"], stats["prompt_tokens"], stats["cached_tokens"]) == (3, 130, 79)
    assert after_reset == 0
    assert (engine.stats()["requests"], engine.stats()["cached_tokens"]) == (1, 0)


def test_cached_tokens_chat_history_prefix_reused() -> None:
    engine = make()
    turn1 = [{"role": "system", "content": prompt(30)}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
    admit(engine, {"model": MODEL, "messages": turn1})
    assert admit(engine, {"model": MODEL, "messages": turn2}).cached >= 32


def test_token_id_prompt_counts_ids_as_tokens() -> None:
    engine = make(block_tokens=16)
    admit(engine, completion(list(range(40))))
    assert engine.counters.prompt_tokens == 40
    assert admit(engine, completion(list(range(40)))).cached == 32  # two full blocks of 16


@pytest.mark.parametrize("capacity", [16, 64, 400])
def test_capacity_of_n_tokens_holds_a_prompt_of_n_tokens(capacity: int) -> None:
    engine = make(capacity_tokens=capacity)
    admit(engine, completion(prompt(capacity)))
    assert admit(engine, completion(prompt(capacity))).cached == capacity - 1
    assert engine.stats()["cache_tokens"] == capacity


def test_lru_eviction_when_capacity_exceeded() -> None:
    # Eight blocks of four tokens: three 16-token prompts do not fit together.
    engine = make(capacity_tokens=32)
    a, b, c = (completion(prompt(16, start)) for start in (0, 100, 200))
    for body in (a, b, c):
        admit(engine, body)
    assert admit(engine, c).cached == 15
    assert admit(engine, a).cached == 0
    assert engine.stats()["cache_tokens"] <= 32


def test_lora_adapter_prefix_not_shared_with_base_model() -> None:
    engine = make()
    admit(engine, completion(prompt(40)))
    assert admit(engine, completion(prompt(40), lora_adapter="a")).cached == 0


def test_load_running_and_waiting_follow_clock_and_release() -> None:
    clock = Clock()
    engine = make(fast=False, clock=clock, max_batch=1, prefill_tokens_per_s=100.0)
    first = engine.admit((), 100, 10)  # one second of prefill
    second = engine.admit((), 100, 10)  # waits for the only slot
    assert engine.load() == (1, 1)
    clock.t = second.schedule.prefill_start
    assert engine.load() == (2, 0)
    engine.release(first)
    engine.release(second)
    assert engine.load() == (0, 0)


def test_fast_schedule_has_no_delays() -> None:
    clock = Clock()
    clock.t = 5.0
    ticket = make(clock=clock).admit((), 1000, 100)
    s = ticket.schedule
    assert (s.arrival, s.prefill_start, s.first_token, s.done) == (5.0, 5.0, 5.0, 5.0)


def test_release_counts_sent_tokens_once() -> None:
    engine = make()
    ticket = engine.admit((), 10, 8)
    ticket.emitted = 3
    engine.release(ticket)
    engine.release(ticket)
    assert engine.counters.completion_tokens == 3
    assert engine.load() == (0, 0)


def test_fault_used_up_after_count_requests() -> None:
    engine = make()
    engine.fault = Fault("status", 2, 502)
    taken = [engine.take_fault() for _ in range(3)]
    assert taken == [Fault("status", 2, 502), Fault("status", 1, 502), None]
    assert engine.fault is None


def test_reset_keeps_pending_fault_and_inflight() -> None:
    engine = make()
    ticket = engine.admit((), 10, 1)
    engine.fault = Fault("hang")
    engine.reset()
    assert engine.fault == Fault("hang")
    assert engine.load() == (1, 0)
    engine.release(ticket)


def test_stats_contract_fields() -> None:
    engine = make()
    admit(engine, chat(prompt(20)))
    stats = engine.stats()
    assert {"requests", "prompt_tokens", "cached_tokens"} <= set(stats)
    assert stats["cache_capacity_tokens"] == engine.settings.spec.capacity_tokens
    assert 0.0 <= stats["cache_hit_ratio"] <= 1.0
