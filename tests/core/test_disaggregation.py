"""Prefill/decode disaggregation: the path each request takes, priced by the link."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.decision import Lease, RoutingCore
from router.core.disaggregation import (
    DEFAULT_KV_BYTES_PER_TOKEN,
    DisaggSettings,
    ModelShape,
    Role,
    decide,
)
from router.core.load import EngineReport
from router.presets import preset_path
from router.yaml_files import load_policy

ROLES: dict[str, Role] = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode"}
ENGINES = list(ROLES)
# ~4,000 tokens at four characters per token.
LONG = "the quick brown fox jumps over the lazy dog " * 360


def core() -> RoutingCore:
    r = RoutingCore(load_policy(preset_path("kv-aware")))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def body(prompt: str) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt}


def busy(r: RoutingCore, engine: str, running: int, now: float = 0.0) -> None:
    """``engine`` reports ``running`` sequences in its batch (decoding)."""
    r.loads.engine_report(engine, EngineReport(running=running, waiting=0, kv_usage=0.1), now)


def test_the_arithmetic_users_quote() -> None:
    # 80 layers, 8 KV heads, 128 dims, FP16: 327,680 bytes a token; 4,000 tokens: 1.31 GB.
    shape = ModelShape(layers=80, kv_heads=8, head_dim=128)
    assert shape.kv_bytes_per_token == 327_680
    s = DisaggSettings(kv_bytes_per_token=shape.kv_bytes_per_token, link_gbps=400)
    assert s.transfer_bytes(4000) == 1_310_720_000
    # 2.6 GB over ~50 GB/s (400 Gbps): 52 ms; over 25 Gbps it is 0.84 s.
    assert s.transfer_seconds(8000) == pytest.approx(0.0524, rel=1e-3)
    assert DisaggSettings(kv_bytes_per_token=327_680, link_gbps=25).transfer_seconds(
        8000
    ) == pytest.approx(0.839, rel=1e-3)
    assert DEFAULT_KV_BYTES_PER_TOKEN == 131_072


def test_a_long_new_prompt_splits_over_a_fast_link() -> None:
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=400))
    assert d.path == "split" and d.why == "split-cheaper"
    assert d.engine in ("d1", "d2") and d.prefill_engine in ("p1", "p2")
    assert d.split_seconds is not None and d.whole_seconds is not None
    assert d.split_seconds < d.whole_seconds
    assert d.transfer_tokens == d.decode.inputs.prompt_tokens  # type: ignore[union-attr]
    out = d.explain()
    assert out["path"] == "split" and out["transfer"]["bytes"] == d.transfer_bytes
    assert out["decode"]["engine"] == d.engine and out["prefill"]["engine"] == d.prefill_engine


def test_a_slow_link_keeps_the_request_whole() -> None:
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    roles: dict[str, Role] = {**ROLES, "d1": "both", "d2": "both"}
    s = DisaggSettings(link_gbps=1, protocol="sglang")  # a prefill server cannot answer alone
    d = decide(r, body(LONG), roles, ENGINES, 1.0, s)
    assert d.path == "whole" and d.engine in ("d1", "d2") and d.why == "whole-cheaper"
    assert d.split_seconds is not None and d.whole_seconds is not None
    assert d.split_seconds > d.whole_seconds


def test_sglang_decode_servers_take_only_split_requests() -> None:
    r = core()
    s = DisaggSettings(link_gbps=1, protocol="sglang")
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, s)
    assert d.path == "split" and d.why == "protocol-splits" and d.prefill_engine in ("p1", "p2")
    alone = decide(r, body(LONG), ROLES, ["d1"], 1.0, s)
    assert alone.engine is None and alone.why == "no-prefill-engine"


def test_a_slow_link_with_vllm_lets_an_idle_prefill_engine_answer_whole() -> None:
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=1))
    assert d.path == "whole" and d.engine in ("p1", "p2")
    assert d.why == "prefill-engine-cheaper"
    assert d.decision is d.prefill


def queue_prefill(r: RoutingCore, engine: str, prompts: int) -> list[Lease]:
    """``prompts`` new prompts of ~4,000 tokens sent to ``engine`` and not prefilled yet."""
    leases = []
    for i in range(prompts):
        d = r.decide(body(f"document {engine} {i}: {LONG}"), [engine], 0.0)
        leases.append(r.acquire(d, engine, 0.0))
    return leases


def test_a_long_prefill_queue_keeps_the_request_whole_on_the_decode_engine() -> None:
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    queued = [*queue_prefill(r, "p1", 10), *queue_prefill(r, "p2", 10)]
    fast = DisaggSettings(link_gbps=400)
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, fast)
    # 40,000 tokens ahead on either prefill engine: 4 s before its prefill even starts.
    assert d.path == "whole" and d.engine in ("d1", "d2") and d.why == "whole-cheaper"
    assert d.split_seconds is not None and d.whole_seconds is not None
    assert d.split_seconds > 4.0 > d.whole_seconds
    for lease in queued:
        r.release(lease)
    idle = decide(r, body(LONG), ROLES, ENGINES, 1.0, fast)
    assert idle.path == "split" and idle.why == "split-cheaper"


def test_full_decode_batches_send_the_request_whole_to_a_prefill_engine() -> None:
    r = core()
    full = EngineReport(running=32, waiting=20, kv_usage=0.5)
    for e in ("d1", "d2"):
        r.loads.engine_report(e, full, 0.0)
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=400))
    # A split's decode half would wait for 20 batch slots there, like a whole request.
    assert d.path == "whole" and d.engine in ("p1", "p2") and d.why == "prefill-engine-cheaper"
    assert d.decision is d.prefill
    wait = 8192 * 20 / DisaggSettings().prefill_tokens_per_s  # the preset's wait_tokens
    assert d.split_seconds is not None and d.split_seconds > wait
    assert d.prefill_whole_seconds is not None and d.prefill_whole_seconds < wait
    # With slots free again the same request splits.
    for e in ("d1", "d2"):
        r.loads.engine_report(e, EngineReport(running=8, waiting=0, kv_usage=0.1), 0.5)
    again = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=400))
    assert again.path == "split" and again.why == "split-cheaper"


def test_an_idle_prefill_engine_is_still_charged_the_stall_it_decodes_beside() -> None:
    # Nothing runs on the prefill engine, yet answering there would decode beside the prefills
    # it goes on to run: its estimate carries the stall, so a fast link keeps the split.
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=400))
    assert d.path == "split"
    assert d.prefill_whole_seconds is not None and d.split_seconds is not None
    assert d.prefill_whole_seconds > d.split_seconds


def test_a_follow_up_turn_stays_where_its_conversation_lives() -> None:
    r = core()
    busy(r, "d1", 8)
    busy(r, "d2", 8)
    first = decide(r, body(LONG), ROLES, ENGINES, 0.0, DisaggSettings(link_gbps=400))
    assert first.path == "split" and first.decode is not None and first.engine is not None
    lease = r.acquire(first.decode, first.engine, 0.0, prefills=False)
    r.record(lease, 0.0)
    r.release(lease)
    then = decide(r, body(LONG + " and a short reply"), ROLES, ENGINES, 1.0, DisaggSettings())
    assert then.path == "whole" and then.engine == first.engine
    assert then.why == "few-new-tokens" and then.transfer_tokens < 256


def test_an_idle_decode_engine_is_not_charged_a_stall() -> None:
    # Nothing decodes beside it: over a slow link the local prefill is simply quicker.
    r = core()
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=10))
    assert d.path == "whole" and d.engine in ("d1", "d2")


def test_roles_missing_a_pool() -> None:
    r = core()
    only_decode = decide(r, body(LONG), ROLES, ["d1", "d2"], 1.0, DisaggSettings())
    assert only_decode.path == "whole" and only_decode.why == "no-prefill-engine"
    only_prefill = decide(r, body(LONG), ROLES, ["p1"], 1.0, DisaggSettings())
    assert only_prefill.engine == "p1" and only_prefill.why == "no-decode-engine"
    sglang = decide(r, body(LONG), ROLES, ["p1"], 1.0, DisaggSettings(protocol="sglang"))
    assert sglang.engine is None and sglang.decision is not None


def test_a_both_engine_is_never_its_own_prefill_engine() -> None:
    r = core()
    roles: dict[str, Role] = {"x": "both"}
    d = decide(r, body(LONG), roles, ["x"], 1.0, DisaggSettings(link_gbps=900 * 8))
    assert d.path == "whole" and d.engine == "x" and d.prefill_engine is None


def test_a_split_decode_lease_charges_no_prefill() -> None:
    r = core()
    d = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=400))
    assert d.decode is not None and d.engine is not None
    lease = r.acquire(d.decode, d.engine, 1.0, prefills=False)
    assert lease.tokens == 0
    assert r.loads.tokens([d.engine]) == [0]
    r.release(lease)
    assert r.outstanding == 0


def test_a_peer_s_rule_fixes_the_path_and_still_shows_the_prices() -> None:
    r = core()
    # Idle engines over a slow link: the cost decider keeps the request whole...
    cost = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(link_gbps=10))
    assert cost.path == "whole"
    # ...always splits it anyway, and a follow-up's few new tokens too.
    always = decide(r, body(LONG), ROLES, ENGINES, 1.0, DisaggSettings(decider="always"))
    assert always.path == "split" and always.why == "decider-always"
    assert always.whole_seconds is not None and always.split_seconds is not None
    over = DisaggSettings(decider="threshold", threshold_tokens=100)
    assert decide(r, body(LONG), ROLES, ENGINES, 1.0, over).why == "over-threshold"
    under = DisaggSettings(decider="threshold", threshold_tokens=100_000)
    kept = decide(r, body(LONG), ROLES, ENGINES, 1.0, under)
    assert kept.path == "whole" and kept.why == "under-threshold"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"protocol": "grpc"},
        {"link_gbps": 0},
        {"kv_bytes_per_token": 0},
        {"stay_below_tokens": -1},
        {"decode_stall_weight": -0.5},
        {"prefill_tokens_per_s": 0},
        {"decider": "sometimes"},
        {"threshold_tokens": -1},
    ],
)
def test_settings_refuse_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DisaggSettings(**kwargs)
