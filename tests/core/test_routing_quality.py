"""What a decision says of routing quality: reach, why not the deepest, where the prefix broke."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.decision import RoutingCore
from router.core.load import EngineReport
from router.core.policy import load_policy_text
from router.core.turns import Turns
from router.core.verdict import NOT_DEEPEST, Decision

ENGINES = ["a", "b", "c", "d"]
BLOCK = 64  # block_chars of every policy here
OVERLAP = "scorers: [{type: prefix-overlap, weight: 1}, {type: load, weight: 0.1}]\n"


def core(text: str) -> RoutingCore:
    r = RoutingCore(load_policy_text(f"name: t\nblock_chars: {BLOCK}\n" + text, "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def chat(*contents: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents]}


def held_by(r: RoutingCore, engine: str, b: dict[str, Any], session: str | None = None) -> None:
    """``engine`` answered ``b`` (and its load is back)."""
    d = r.decide(b, [engine], 0.0, session)
    lease = r.acquire(d, engine, 0.0)
    r.record(lease, 0.0)
    r.release(lease)


def busy(r: RoutingCore, engine: str, n: int) -> None:
    """``n`` requests of unrelated prompts in flight on ``engine`` (leases kept)."""
    for i in range(n):
        d = r.decide({"model": "m", "prompt": f"unrelated {i} " * 20}, [engine], 0.0)
        r.acquire(d, engine, 0.0)


DOC = "a paragraph of a shared document, repeated for length. " * 12  # 10 blocks of 64 chars


def test_decision_deepest_pick_has_no_reason_and_reaches_what_it_routes() -> None:
    r = core(OVERLAP)
    held_by(r, "b", {"model": "m", "prompt": DOC})
    d = r.decide({"model": "m", "prompt": DOC + " and a question?"}, ENGINES, 1.0)
    assert d.engine == "b" and d.not_deepest is None
    assert d.reachable == d.deepest == d.overlap_of("b") == len(DOC) // BLOCK
    assert d.believed_tokens(d.reachable) == d.reachable * BLOCK // 4


def test_decision_believed_tokens_never_exceed_the_prompt() -> None:
    d = core(OVERLAP).decide({"model": "m", "prompt": DOC}, ENGINES, 0.0)
    assert d.believed_tokens(10**6) == d.prompt_tokens


def _cap() -> Decision:
    r = core(OVERLAP + "filters: [{type: bounded-load, epsilon: 0.0, min_cap: 0}]\n")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    busy(r, "a", 2)
    return r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0)


def _policy() -> Decision:
    r = core("picker: round-robin\n")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    d = r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0)
    assert d.engine != "a"  # the turn after the last pick
    return d


def _spread() -> Decision:
    r = core(OVERLAP + "hot_prefix: {spread_above: 1}\n")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    for _ in range(2):  # two of its requests in flight on its one holder: hot
        d = r.decide({"model": "m", "prompt": DOC}, ["a"], 0.0)
        r.acquire(d, "a", 0.0)
    return r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0)


def _session() -> Decision:
    r = core("scorers: [{type: session-affinity, weight: 5}, {type: prefix-overlap, weight: 1}]\n")
    held_by(r, "c", {"model": "m", "prompt": "the session's own earlier question " * 3}, "s")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    return r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0, "s")


def _flow_control() -> Decision:
    r = core("scorers: [{type: prefix-overlap, weight: 0.1}, {type: ttft-estimate, weight: 1}]\n")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    r.loads.engine_report("a", EngineReport(running=32, waiting=40), at=1.0)
    return r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0)


def _load() -> Decision:
    r = core("scorers: [{type: prefix-overlap, weight: 0.1}, {type: load, weight: 1}]\n")
    held_by(r, "a", {"model": "m", "prompt": DOC})
    busy(r, "a", 3)
    return r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_cap, "cap"),
        (_policy, "policy"),
        (_spread, "spread"),
        (_session, "session"),
        (_flow_control, "flow_control"),
        (_load, "load"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_decision_not_deepest_names_why_the_deeper_holder_lost(make: Any, reason: str) -> None:
    d = make()
    assert d.engine != "a" and d.overlap_of("a") == d.deepest > d.overlap_of(str(d.engine))
    assert d.not_deepest == reason and reason in NOT_DEEPEST
    assert d.explain()["not_deepest"] == reason
    # Over the cap, the deepest holder is not eligible: nothing eligible holds anything.
    assert d.reachable == (d.overlap_of(str(d.engine)) if reason == "cap" else d.deepest)


def test_decision_divergence_is_the_first_block_nobody_holds() -> None:
    r = core(OVERLAP)
    held_by(r, "c", {"model": "m", "prompt": DOC})
    d = r.decide({"model": "m", "prompt": DOC[:-BLOCK] + "X" * (3 * BLOCK)}, ENGINES, 1.0)
    assert d.divergence() == {
        "block": 9,
        "char_offset": 9 * BLOCK,
        "holders": ["c"],
    }
    assert d.explain()["divergence"] == d.divergence()


def test_decision_divergence_none_when_whole_prompt_is_held_and_block_zero_when_cold() -> None:
    r = core(OVERLAP)
    held_by(r, "c", {"model": "m", "prompt": DOC})
    assert r.decide({"model": "m", "prompt": DOC}, ENGINES, 1.0).divergence() is None
    cold = r.decide({"model": "m", "prompt": "nobody has seen this " * 10}, ENGINES, 1.0)
    assert cold.divergence() == {"block": 0, "char_offset": 0, "holders": []}


SYSTEM = "You are a careful assistant. Today is a day like any other day. " * 4


def test_follow_up_turn_that_extends_the_last_is_not_broken() -> None:
    r = core(OVERLAP)
    turn1 = chat(SYSTEM, "first question, long enough to fill a block or two of text")
    held_by(r, "a", turn1, "conv")
    turn2 = chat(SYSTEM, "first question, long enough to fill a block or two of text", "more")
    d = r.decide(turn2, ENGINES, 1.0, "conv")
    assert d.broken_at is None and d.explain()["prefix_broken_at"] is None


def test_follow_up_turn_that_rewrites_an_early_message_is_broken_at_its_block() -> None:
    r = core(OVERLAP)
    history = [SYSTEM, "what is a prefix cache? " * 8, "it keeps computed keys. " * 8]
    held_by(r, "a", chat(*history), "conv")
    # The client rewrites its second message: the blocks before it are still held.
    rewritten = chat(SYSTEM, "WHAT IS A PREFIX CACHE? " * 8, history[2], "and then?")
    d = r.decide(rewritten, ENGINES, 1.0, "conv")
    text = r.keys_of(rewritten)[0].text
    assert text is not None
    first_changed = text.index("WHAT") // BLOCK
    assert d.broken_at == first_changed == d.deepest
    assert d.explain()["prefix_broken_at"] == {
        "block": first_changed,
        "char_offset": first_changed * BLOCK,
    }
    # Another conversation, or none, is never flagged.
    assert r.decide(rewritten, ENGINES, 1.0, "other").broken_at is None
    assert r.decide(rewritten, ENGINES, 1.0).broken_at is None


def test_turns_are_bounded_least_recent_first() -> None:
    t = Turns(max_conversations=2)
    for conv in ("x", "y", "x", "z"):
        t.remember(conv, [1, 2, 3])
    assert len(t) == 2
    assert t.broken_at("y", [9, 9, 9], 1) is None  # forgotten
    assert t.broken_at("x", [9, 9, 9], 1) == 1
    assert t.broken_at("z", [1, 2, 3, 4], 4) is None
    assert t.broken_at("z", [1, 2], 2) == 2  # shorter than the last turn: broken
    t.remember("z", [])  # a turn of no full block forgets the last one
    assert t.broken_at("z", [5], 0) is None and len(t) == 1
