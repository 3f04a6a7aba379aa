"""The simulated fleets' deciders, and the stay rule's view of blocks still in flight."""

from __future__ import annotations

from typing import Any

from router.core.decision import RoutingCore
from router.core.disaggregation import DisaggSettings, Role, decide
from router.core.load import EngineReport
from router.core.pd_deciders import LLMD_THRESHOLD_TOKENS, decider
from router.presets import preset_path
from router.yaml_files import load_policy

ROLES: dict[str, Role] = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode"}
ENGINES = list(ROLES)
LONG = "the quick brown fox jumps over the lazy dog " * 360  # about 4,000 tokens
FAST = DisaggSettings(link_gbps=400)


def core() -> RoutingCore:
    r = RoutingCore(load_policy(preset_path("kv-aware")))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    for e in ("d1", "d2"):
        r.loads.engine_report(e, EngineReport(running=8, waiting=0, kv_usage=0.1), 0.0)
    return r


def body(prompt: str) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt}


def test_a_transfer_not_landed_does_not_keep_the_next_turn_on_the_decode_engine() -> None:
    r = core()
    first = decide(r, body(LONG), ROLES, ENGINES, 0.0, FAST)
    assert first.path == "split" and first.decode is not None and first.engine is not None
    lease = r.acquire(first.decode, first.engine, 0.0, prefills=False)
    follow = body(LONG + " and a short reply")
    early = decide(r, follow, ROLES, ENGINES, 0.1, FAST)
    assert early.why != "few-new-tokens"
    r.record(lease, 0.2)  # the decode engine answered: the blocks have landed
    late = decide(r, follow, ROLES, ENGINES, 0.3, FAST)
    assert late.why == "few-new-tokens" and late.engine == first.engine
    r.release(lease)


def test_the_peers_rules_override_only_the_path() -> None:
    r = core()
    args = (r, body(LONG), ROLES, ENGINES, 1.0, None, 4000)
    kv = decider("kvrouter", FAST, LLMD_THRESHOLD_TOKENS)(*args)
    always = decider("always-split", FAST, LLMD_THRESHOLD_TOKENS)(*args)
    llmd = decider("threshold", FAST, LLMD_THRESHOLD_TOKENS)(*args)
    high = decider("threshold", FAST, 1_000_000)(*args)
    assert always.path == llmd.path == "split" and high.path == "whole"
    assert always.engine == llmd.engine == high.engine == kv.decode.engine  # type: ignore[union-attr]
    assert always.prefill_engine == kv.prefill.engine  # type: ignore[union-attr]
    assert (always.why, llmd.why, high.why) == (
        "decider-always",
        "over-threshold",
        "under-threshold",
    )
    agg = decider("aggregated", FAST, 0)(r, body(LONG), ROLES, ENGINES, 1.0, None, 4000)
    assert agg.path == "whole" and agg.prefill is None and agg.decision is agg.decode
