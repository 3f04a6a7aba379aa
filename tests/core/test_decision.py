"""The decision function: filters, scorers, pickers, load taken and given back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.decision import Router
from router.core.policy import Scorer, load_policy, load_policy_text
from router.core.scoring import SCORERS, Inputs
from router.presets import preset_path

ENGINES = ["a", "b", "c", "d"]


def router(text: str) -> Router:
    r = Router(load_policy_text("name: t\n" + text, "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def body(prompt: str, model: str = "m") -> dict[str, Any]:
    return {"model": model, "prompt": prompt}


LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~1800 chars, 7 blocks
KV = "scorers: [{type: prefix-overlap, weight: 1}, {type: load, weight: 0.1}]\n"


def test_decide_prefix_goes_where_it_was_routed() -> None:
    r = router(KV)
    first = r.route(body(LONG), ENGINES, now=0.0)
    r.finish(first)
    again = r.route(body(LONG + " and more"), ENGINES, now=1.0)
    assert again.engine == first.engine
    assert again.reason == "best-score" and again.overlap_ratio > 0.9


def test_decide_cold_prefix_goes_to_ring_home_on_every_replica() -> None:
    homes = {router(KV).route(body(LONG), ENGINES, now=0.0).engine for _ in range(3)}
    assert len(homes) == 1
    d = router(KV).route(body(LONG), ENGINES, now=0.0)
    assert d.reason == "cold-prefix-ring"


def test_decide_bounded_load_spills_hot_prefix() -> None:
    r = router(KV + "filters: [{type: bounded-load, epsilon: 0.0}]\n")
    picks = [str(r.route(body(LONG), ENGINES, now=float(i)).engine) for i in range(8)]
    # Nobody finishes: with epsilon 0 each engine takes exactly its share.
    assert sorted(picks) == sorted(ENGINES * 2)


def test_decide_round_robin_cycles() -> None:
    r = router("picker: round-robin\n")
    picks = [str(r.route(body(f"{i}" * 300), ENGINES, now=0.0).engine) for i in range(8)]
    assert sorted(picks) == sorted(ENGINES * 2)


def test_decide_least_load_picks_idlest() -> None:
    r = router("scorers: [{type: load, weight: 1}]\ncold_prefix: score\n")
    held = [r.route(body(f"{i}" * 300), ENGINES, now=0.0) for i in range(3)]
    d = r.route(body("x" * 300), ENGINES, now=0.0)
    assert d.engine not in {h.engine for h in held}


def test_decide_session_affinity_follows_session() -> None:
    r = router(
        "scorers: [{type: session-affinity, weight: 1}, {type: load, weight: 0.5}]\n"
        "cold_prefix: score\n"
    )
    first = r.route(body("x"), ENGINES, now=0.0, session="s1")
    r.finish(first)
    for i in range(4):
        d = r.route(body(f"y{i}"), ENGINES, now=1.0, session="s1")
        assert d.engine == first.engine
        r.finish(d)


def test_decide_only_candidates_are_picked() -> None:
    r = router(KV)
    r.route(body(LONG), ["a"], now=0.0)
    d = r.route(body(LONG), ["b", "c"], now=0.0)
    assert d.engine in {"b", "c"}


def test_decide_no_candidates_returns_none_and_takes_nothing() -> None:
    r = router(KV)
    d = r.route(body(LONG), [], now=0.0)
    assert d.engine is None and d.reason == "no-candidates"
    assert r.loads.local_all() == {}


def test_route_retry_finish_release_every_counter() -> None:
    r = router(KV)
    d = r.route(body(LONG), ENGINES, now=0.0)
    first = d.engine
    second = r.retry(d, now=0.0)
    assert second is not None and second != first
    assert r.loads.local(first).requests == 0  # type: ignore[arg-type]
    r.finish(d)
    r.finish(d)  # twice is harmless
    assert r.loads.local_all() == {}


def test_route_retry_exhausts_candidates() -> None:
    r = router(KV)
    d = r.route(body(LONG), ["a", "b"], now=0.0)
    assert r.retry(d, now=0.0) is not None
    assert r.retry(d, now=0.0) is None
    assert r.loads.local_all() == {}


def test_decision_explain_lists_every_candidate() -> None:
    r = router(KV)
    d = r.route(body(LONG), ENGINES, now=0.0)
    ex = d.explain()
    assert ex["engine"] == d.engine and ex["blocks"] == len(d.keys)
    assert [c["engine"] for c in ex["candidates"]] == ENGINES
    assert set(ex["candidates"][0]["scores"]) == {"prefix-overlap", "load"}


def test_decide_pure_changes_nothing() -> None:
    r = router(KV)
    _, keys = r.keys_of(body(LONG))
    r.decide(keys, 100, ENGINES, now=0.0)
    assert len(r.index) == 0 and r.loads.local_all() == {}


def test_set_policy_new_block_size_resets_index_but_keeps_engines() -> None:
    r = router(KV)
    r.route(body(LONG), ENGINES, now=0.0)
    r.set_policy(load_policy_text("name: t\nblock_chars: 1024\n" + KV, "t"))
    assert len(r.index) == 0 and set(r.index.engines) == set(ENGINES)


def test_set_policy_new_block_size_delta_numbering_goes_on() -> None:
    # Gossip peers drop a delta whose (origin, seq) they hold: a rebuilt index must not reuse one.
    r = Router(load_policy_text("name: t\n" + KV, "t"), origin="replica-a/1")
    r.set_engines(dict.fromkeys(ENGINES, 1))
    before = r.route(body(LONG), ENGINES, now=0.0).delta
    r.set_policy(load_policy_text("name: t\nblock_chars: 1024\n" + KV, "t"))
    after = r.route(body(LONG), ENGINES, now=1.0).delta
    assert before is not None and after is not None
    assert (after.origin, after.seq) == ("replica-a/1", before.seq + 1)


@pytest.mark.parametrize("name", ["kv-aware", "least-load", "consistent-hash", "round-robin"])
def test_presets_route_and_release(name: str) -> None:
    r = Router(load_policy(preset_path(name)))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    ds = [r.route(body(LONG + str(i)), ENGINES, now=0.0) for i in range(10)]
    assert all(d.engine in ENGINES for d in ds)
    for d in ds:
        r.finish(d)
    assert r.loads.local_all() == {}


@given(
    n=st.integers(1, 12),
    data=st.data(),
)
def test_scorers_stay_in_unit_interval(n: int, data: st.DataObject) -> None:
    blocks = data.draw(st.integers(0, 50))
    x = Inputs(
        candidates=[f"e{i}" for i in range(n)],
        blocks=blocks,
        overlaps=data.draw(st.lists(st.integers(0, blocks), min_size=n, max_size=n)),
        requests=data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
        tokens=data.draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n)),
        session_engine=data.draw(st.sampled_from([None, "e0", "x"])),
        prompt_tokens=data.draw(st.integers(0, 10**6)),
        block_tokens=data.draw(st.integers(1, 1024)),
    )
    for name, fn in SCORERS.items():
        for metric in ("requests", "tokens"):
            scores = fn(Scorer(name, 1.0, metric=metric), x)
            assert len(scores) == n
            assert all(0.0 <= v <= 1.0 for v in scores), (name, scores)
