"""The routing core: the decision (a query), and acquire, record, release, forget."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.decision import Lease, RoutingCore
from router.core.load import EngineReport
from router.core.policy import load_policy_text
from router.core.verdict import Decision
from router.presets import preset_path
from router.yaml_files import load_policy

ENGINES = ["a", "b", "c", "d"]


def core(text: str) -> RoutingCore:
    r = RoutingCore(load_policy_text("name: t\n" + text, "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def body(prompt: str, model: str = "m") -> dict[str, Any]:
    return {"model": model, "prompt": prompt}


def answered(
    r: RoutingCore, b: dict[str, Any], engines: list[str], now: float, session: str | None = None
) -> tuple[Decision, Lease]:
    """Decide, acquire the pick and record it (its engine answered); the lease is still held."""
    d = r.decide(b, engines, now, session)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, now)
    r.record(lease, now)
    return d, lease


LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~1800 chars, 7 blocks
KV = "scorers: [{type: prefix-overlap, weight: 1}, {type: load, weight: 0.1}]\n"


def test_decide_prefix_goes_where_it_was_answered() -> None:
    r = core(KV)
    first, lease = answered(r, body(LONG), ENGINES, now=0.0)
    r.release(lease)
    again = r.decide(body(LONG + " and more"), ENGINES, now=1.0)
    assert again.engine == first.engine
    assert again.reason == "best-score" and again.overlap_ratio > 0.9


def test_decide_cold_prefix_goes_to_ring_home_on_every_replica() -> None:
    homes = {core(KV).decide(body(LONG), ENGINES, now=0.0).engine for _ in range(3)}
    assert len(homes) == 1
    assert core(KV).decide(body(LONG), ENGINES, now=0.0).reason == "cold-prefix-ring"


def test_decide_bounded_load_spills_hot_prefix() -> None:
    r = core(KV + "filters: [{type: bounded-load, epsilon: 0.0}]\n")
    picks = [str(answered(r, body(LONG), ENGINES, now=float(i))[0].engine) for i in range(8)]
    # Nobody finishes: with epsilon 0 each engine takes exactly its share.
    assert sorted(picks) == sorted(ENGINES * 2)


@pytest.mark.parametrize(("min_cap", "first_engine_takes"), [(0, 1), (3, 3)])
def test_decide_bounded_load_min_cap_keeps_light_load_on_its_cache(
    min_cap: int, first_engine_takes: int
) -> None:
    """Below ``min_cap`` requests the cap does not bite: a prefix stays on its engine."""
    r = core(KV + f"filters: [{{type: bounded-load, epsilon: 0.0, min_cap: {min_cap}}}]\n")
    picks = [str(answered(r, body(LONG), ENGINES, now=float(i))[0].engine) for i in range(4)]
    assert picks.count(picks[0]) == first_engine_takes


def test_decide_round_robin_cycles_as_attempts_are_acquired() -> None:
    r = core("picker: round-robin\n")
    picks = [str(answered(r, body(f"{i}" * 300), ENGINES, now=0.0)[0].engine) for i in range(8)]
    assert sorted(picks) == sorted(ENGINES * 2)


def test_decide_round_robin_turn_unchanged_by_queries() -> None:
    r = core("picker: round-robin\n")
    picks = {r.decide(body("x" * 300), ENGINES, now=0.0).engine for _ in range(5)}
    assert len(picks) == 1


def test_decide_least_load_picks_idlest() -> None:
    r = core("scorers: [{type: load, weight: 1}]\ncold_prefix: score\n")
    held = [answered(r, body(f"{i}" * 300), ENGINES, now=0.0)[0] for i in range(3)]
    d = r.decide(body("x" * 300), ENGINES, now=0.0)
    assert d.engine not in {h.engine for h in held}


def test_decide_session_affinity_follows_session() -> None:
    r = core(
        "scorers: [{type: session-affinity, weight: 1}, {type: load, weight: 0.5}]\n"
        "cold_prefix: score\n"
    )
    first, lease = answered(r, body("x"), ENGINES, now=0.0, session="s1")
    r.release(lease)
    for i in range(4):
        d, lease = answered(r, body(f"y{i}"), ENGINES, now=1.0, session="s1")
        assert d.engine == first.engine
        r.release(lease)


def test_decide_only_candidates_are_picked() -> None:
    r = core(KV)
    answered(r, body(LONG), ["a"], now=0.0)
    d = r.decide(body(LONG), ["b", "c"], now=0.0)
    assert d.engine in {"b", "c"}


def test_decide_no_candidates_returns_none_and_empty_plan() -> None:
    d = core(KV).decide(body(LONG), [], now=0.0)
    assert d.engine is None and d.reason == "no-candidates" and d.plan() == ()


def test_decide_pure_changes_nothing() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    assert len(r.index) == 0 and r.loads.local_all() == {} and not r.predictions
    assert r.outstanding == 0


def test_decision_plan_is_pick_then_every_other_candidate_once() -> None:
    d = core(KV).decide(body(LONG), ENGINES, now=0.0)
    assert d.plan()[0] == d.engine and sorted(d.plan()) == sorted(ENGINES)


def test_decision_is_frozen() -> None:
    d = core(KV).decide(body(LONG), ENGINES, now=0.0)
    with pytest.raises(AttributeError):
        d.engine = "x"  # type: ignore[misc]


def test_acquire_claims_blocks_provisionally_so_a_burst_lands_together() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    r.acquire(d, d.engine, 0.0)  # no answer yet
    burst = r.decide(body(LONG), ENGINES, now=0.0)
    assert burst.engine == d.engine
    i = list(burst.inputs.candidates).index(d.engine)
    assert burst.predicted[i] == len(d.keys) == burst.inputs.overlaps[i]
    assert burst.explain()["candidates"][i]["predicted_blocks"] == len(d.keys)
    assert len(r.predictions) == len(d.keys)


def test_acquire_claims_only_blocks_not_already_held() -> None:
    r = core(KV)
    first, lease = answered(r, body(LONG), ENGINES, now=0.0)
    r.release(lease)
    d = r.decide(body(LONG + " and a new tail " * 40), ENGINES, now=1.0)
    assert d.engine is not None and d.engine == first.engine
    lease = r.acquire(d, d.engine, 1.0)
    assert lease.claimed == d.keys[len(first.keys) :]
    r.release(lease)  # failed: the new tail goes, what was confirmed before stays
    assert r.index.blocks(d.engine) == len(first.keys)


def test_failed_attempt_keeps_blocks_another_attempt_confirmed() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    doomed = r.acquire(d, d.engine, 0.0)
    burst = r.decide(body(LONG), ENGINES, now=0.0)
    ok = r.acquire(burst, d.engine, 0.0)
    r.record(ok, 0.0)  # the second request's answer began: the engine holds the prefix
    r.release(doomed)  # the first one failed afterwards
    r.release(ok)
    assert r.index.blocks(d.engine) == len(d.keys) and not r.predictions


def test_failed_attempt_leaves_no_hole_under_one_that_relies_on_it() -> None:
    r = core(KV)
    first, lease = answered(r, body(LONG), ENGINES, now=0.0)
    r.release(lease)
    engine = first.engine
    assert engine is not None
    middle = r.decide(body(LONG + " a middle part " * 80), [engine], now=1.0)
    doomed = r.acquire(middle, engine, 1.0)  # claims the middle blocks, no answer yet
    longer = r.decide(body(LONG + " a middle part " * 80 + " and a tail " * 80), [engine], 1.0)
    assert longer.overlap_of(engine) == len(middle.keys)  # relies on the provisional middle
    ok = r.acquire(longer, engine, 1.0)
    r.release(doomed)  # the middle's own attempt failed: the blocks stay, ``ok`` claims them
    assert r.index.overlap(engine, longer.keys) == len(longer.keys)
    r.record(ok, 2.0)
    r.release(ok)
    assert r.index.overlap(engine, longer.keys) == len(longer.keys) and not r.predictions
    r.release(r.acquire(r.decide(body(LONG + " another " * 90), [engine], 3.0), engine, 3.0))
    assert not r.predictions and r.outstanding == 0


def test_release_without_answer_leaves_no_belief() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    r.release(r.acquire(d, d.engine, 0.0))
    after = r.decide(body(LONG), ENGINES, now=0.0)
    assert all(o == 0 for o in after.inputs.overlaps)
    assert len(r.index) == 0 and not r.predictions and r.loads.local_all() == {}


def test_failed_attempt_then_fallback_credits_only_the_engine_that_answered() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    failed, fallback = d.plan()[:2]
    r.release(r.acquire(d, failed, 0.0))
    lease = r.acquire(d, fallback, 0.0)
    delta = r.record(lease, now=0.0)
    r.release(lease)
    assert delta is not None and delta.engine == fallback and delta.added == d.keys
    again = r.decide(body(LONG), ENGINES, now=1.0)
    overlaps = dict(zip(again.inputs.candidates, again.inputs.overlaps, strict=True))
    assert overlaps[failed] == 0 and overlaps[fallback] == len(d.keys)
    assert r.outstanding == 0 and r.loads.local_all() == {} and not r.predictions


def test_record_moves_prediction_into_index_once() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, 0.0)
    assert r.record(lease, now=0.0) is not None
    assert r.record(lease, now=0.0) is None  # the first byte happens once
    assert not r.predictions and r.index.blocks(d.engine) == len(d.keys)
    r.release(lease)
    assert r.index.blocks(d.engine) == len(d.keys)  # the engine still holds them


def test_release_twice_is_harmless_and_counters_return_to_zero() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, 0.0)
    assert r.loads.local(d.engine).requests == 1 and r.outstanding == 1
    r.release(lease)
    r.release(lease)
    assert r.loads.local_all() == {} and r.outstanding == 0


def test_prompt_tokens_count_as_queued_until_the_answer_begins() -> None:
    r = core(KV)
    d = r.decide(body(LONG), ENGINES, now=0.0)
    assert d.engine is not None
    first = r.acquire(d, d.engine, 0.0)
    second = r.acquire(d, d.engine, 0.0)  # the same prompt again, before the first answered
    assert first.tokens > 0 and r.loads.local(d.engine).tokens == first.tokens + second.tokens
    r.record(first, now=1.0)  # prefilled: decoding, no longer queued ahead of anyone
    assert r.loads.local(d.engine).requests == 2
    assert r.loads.local(d.engine).tokens == second.tokens
    r.release(first)  # gives back the request, not the tokens a second time
    assert r.loads.local(d.engine).tokens == second.tokens
    r.release(second)  # no answer: its tokens go back with it
    assert r.loads.local_all() == {} and r.outstanding == 0


def test_forget_clears_what_an_engine_was_believed_to_hold() -> None:
    r = core(KV)
    d, lease = answered(r, body(LONG), ENGINES, now=0.0)
    r.release(lease)
    assert d.engine is not None
    delta = r.forget(d.engine)
    assert delta.cleared and delta.engine == d.engine and r.index.blocks(d.engine) == 0


def test_decision_explain_lists_every_candidate() -> None:
    d = core(KV).decide(body(LONG), ENGINES, now=0.0)
    ex = d.explain()
    assert ex["engine"] == d.engine and ex["blocks"] == len(d.keys)
    assert [c["engine"] for c in ex["candidates"]] == ENGINES
    assert set(ex["candidates"][0]["scores"]) == {"prefix-overlap", "load"}
    assert ex["fallbacks"] == list(d.fallbacks)


def test_set_policy_new_block_size_resets_index_but_keeps_engines() -> None:
    r = core(KV)
    answered(r, body(LONG), ENGINES, now=0.0)
    r.set_policy(load_policy_text("name: t\nblock_chars: 1024\n" + KV, "t"))
    assert len(r.index) == 0 and set(r.index.engines) == set(ENGINES)


def test_set_policy_new_block_size_delta_numbering_goes_on() -> None:
    # Gossip peers drop a delta whose (origin, seq) they hold: a rebuilt index must not reuse one.
    r = RoutingCore(load_policy_text("name: t\n" + KV, "t"), origin="replica-a/1")
    r.set_engines(dict.fromkeys(ENGINES, 1))
    d = r.decide(body(LONG), ENGINES, now=0.0)
    before = r.record(r.acquire(d, str(d.engine), 0.0), now=0.0)
    r.set_policy(load_policy_text("name: t\nblock_chars: 1024\n" + KV, "t"))
    d = r.decide(body(LONG), ENGINES, now=1.0)
    after = r.record(r.acquire(d, str(d.engine), 0.0), now=1.0)
    assert before is not None and after is not None
    assert (after.origin, after.seq) == ("replica-a/1", before.seq + 1)


@pytest.mark.parametrize("name", ["kv-aware", "least-load", "consistent-hash", "round-robin"])
def test_presets_route_and_release(name: str) -> None:
    r = RoutingCore(load_policy(preset_path(name)))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    leases = [answered(r, body(LONG + str(i)), ENGINES, now=0.0)[1] for i in range(10)]
    assert all(lease.engine in ENGINES for lease in leases)
    for lease in leases:
        r.release(lease)
    assert r.loads.local_all() == {} and r.outstanding == 0


def test_hot_prefix_spreads_off_an_engine_whose_batch_is_full() -> None:
    """Its holder's last report shows a full batch and nobody waiting (the limit learned from
    earlier reports): the next request for the prefix would wait for a slot there, so it goes
    to an engine that can start it at once."""
    r = RoutingCore(load_policy(preset_path("kv-aware")))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    doc = body("viral document " * 300)
    holder = answered(r, doc, ENGINES, 0.0)[0].engine
    assert holder is not None
    for e in ENGINES:
        r.loads.engine_report(e, EngineReport(running=4), at=0.5)
    assert r.decide(doc, ENGINES, now=0.6).engine == holder  # free slots: the cache wins
    for at in (1.0, 1.5):
        r.loads.engine_report(holder, EngineReport(running=32, waiting=1), at=at)
    for e in ENGINES:  # busy, all of them, but under the bounded-load cap
        r.loads.engine_report(e, EngineReport(running=32 if e == holder else 16), at=2.0)
    answered(r, doc, [holder], 2.05)  # sent after the report: it waits for a slot
    moves = r.decide(doc, ENGINES, now=2.1)
    assert moves.engine != holder and moves.engine in ENGINES
    held = moves.explain()["candidates"][moves.inputs.candidates.index(holder)]
    assert held["wait_slots"] == 2 and held["overlap_blocks"] == len(moves.keys)


def test_engine_capacity_sizes_its_index_and_survives_a_policy_with_other_blocks() -> None:
    policy = load_policy_text("name: t\nscorers: [{type: prefix-overlap, weight: 1}]\n", "t")
    r = RoutingCore(policy)
    r.set_engines({"a": 1, "b": 1})
    r.engine_capacity("a", 12_800)
    r.engine_capacity("zz", 12_800)  # not an engine: nothing kept
    assert r.index.capacity_blocks("a") == 12_800 // policy.block_tokens
    assert r.index.capacity_blocks("b") == policy.engine_capacity_blocks
    assert r.index.capacity_blocks("zz") == 0
    wider = load_policy_text(
        "name: t\nblock_chars: 1024\nscorers: [{type: prefix-overlap, weight: 1}]\n", "t"
    )
    r.set_policy(wider)  # new keys, a new index: the engine's own size still applies
    assert r.index.capacity_blocks("a") == 12_800 // wider.block_tokens
    r.set_engines({"b": 1})
    r.set_engines({"a": 1, "b": 1})  # gone and back: the policy's size until it says again
    assert r.index.capacity_blocks("a") == wider.engine_capacity_blocks


def test_engine_capacity_read_in_the_routers_tokens_once_usage_says_their_ratio() -> None:
    policy = load_policy_text("name: t\nscorers: [{type: prefix-overlap, weight: 1}]\n", "t")
    r = RoutingCore(policy)
    r.set_engines({"a": 1})
    r.engine_capacity("a", 128_000)
    assert r.index.capacity_blocks("a") == 128_000 // policy.block_tokens
    for _ in range(19):  # too few to say anything yet
        r.calibrate(600, 1000)
    assert r.index.capacity_blocks("a") == 128_000 // policy.block_tokens
    r.calibrate(600, 1000)  # the engine cuts finer: 0.6 of the router's tokens each
    assert r.index.capacity_blocks("a") == int(128_000 * 0.6) // policy.block_tokens
    r.calibrate(0, 1000)  # no count: nothing learnt
    r.calibrate(610, 1000)  # within 5%: no resize
    assert r.index.capacity_blocks("a") == int(128_000 * 0.6) // policy.block_tokens
