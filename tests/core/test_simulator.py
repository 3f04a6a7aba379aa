"""The simulator: engine model, trace formats, replay through the real decision code."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from router.commands.traces import read_trace
from router.core.engine_model import EngineClock, EngineSpec, PrefixCache
from router.core.simulator import Fleet, Outside, Replicas, simulate, simulate_policy
from router.core.stats import percentile
from router.core.workload import (
    MOONCAKE_BLOCK_TOKENS,
    SyntheticSpec,
    TraceFormatError,
    TraceRequest,
    parse_record,
    synthetic,
)
from router.presets import NAMES, preset_path
from router.yaml_files import load_policy
from tests.support import ROOT

SAMPLE = ROOT / "tests" / "data" / "mooncake_conversation_sample.jsonl"
SPEC = EngineSpec(capacity_tokens=400_000)


def test_engine_clock_serialises_prefill_and_bounds_slots() -> None:
    clock = EngineClock(EngineSpec(max_batch=1, prefill_tokens_per_s=100, decode_tokens_per_s=10))
    a = clock.admit(0.0, uncached_tokens=100, output_tokens=10)  # prefill 1 s, decode 1 s
    b = clock.admit(0.0, uncached_tokens=100, output_tokens=10)  # waits for the only slot
    assert (a.first_token, a.done) == (1.0, 2.0)
    assert b.prefill_start == 2.0 and b.ttft == 3.0
    assert clock.busy_seconds == 4.0


def test_prefix_cache_hit_is_whole_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(capacity_tokens=1000, block_tokens=10)
    assert cache.lookup_and_insert([1, 2, 3], prompt_tokens=35, now=0.0) == 0
    assert cache.lookup_and_insert([1, 2, 9], prompt_tokens=35, now=1.0) == 20
    assert cache.lookup_and_insert([1, 2, 9], prompt_tokens=30, now=2.0) == 29


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99


def test_mooncake_record_expands_to_text_of_input_length() -> None:
    rec = {"timestamp": 1500, "input_length": 1000, "output_length": 7, "hash_ids": [4, 5]}
    r = parse_record(rec, "t:1")
    body = r.request_body()
    assert r.timestamp == 1.5 and r.output_tokens == 7
    assert len(body["prompt"]) == 1000 * 4
    assert len(r.engine_keys) == 1000 // MOONCAKE_BLOCK_TOKENS
    other = parse_record(dict(rec, hash_ids=[4, 6]), "t:2")
    assert other.request_body()["prompt"][:2048] == body["prompt"][:2048]
    assert other.engine_keys[0] == r.engine_keys[0]


@pytest.mark.parametrize(
    ("rec", "message"),
    [
        pytest.param(
            {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "x"},
            "hash_ids",
            id="ids-not-list",
        ),
        pytest.param(
            {"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []},
            "timestamp",
            id="negative-time",
        ),
        pytest.param(
            {"timestamp": 0, "input_length": "a", "output_length": 1, "hash_ids": []},
            "input_length",
            id="length-string",
        ),
        pytest.param({"model": "m", "messages": "hi"}, "messages", id="body-bad-messages"),
        pytest.param({"what": 1}, "neither", id="unknown-format"),
        pytest.param([1, 2], "JSON object", id="not-object"),
    ],
)
def test_parse_record_bad_input_names_field(rec: object, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        parse_record(rec, "trace.jsonl:3")


def test_read_trace_bad_json_line_names_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"model": "m", "prompt": "x", "timestamp": 0}\n{oops\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: invalid JSON"):
        read_trace(p)


def test_synthetic_is_deterministic_and_conversations_grow() -> None:
    spec = SyntheticSpec(requests=200, conversations=20)
    a, b = list(synthetic(spec)), list(synthetic(spec))
    assert [r.engine_keys for r in a] == [r.engine_keys for r in b]
    by_session: dict[str | None, list[int]] = {}
    for r in a:
        by_session.setdefault(r.session, []).append(r.prompt_tokens)
    assert any(len(v) > 2 and v == sorted(v) for v in by_session.values())


def test_simulate_sample_kv_aware_beats_round_robin_on_hits() -> None:
    trace = read_trace(SAMPLE)
    policies = [load_policy(preset_path(n)) for n in ("round-robin", "kv-aware")]
    # Engines report their load every 0.5 s, as ``kvrouter simulate`` has them do by default.
    ticks = itertools.count(0, 1000)  # a CPU clock that advances 1 us per reading
    fleet = Fleet(4, SPEC, report_interval=0.5)
    rr, kv, pooled = simulate(policies, trace, fleet, cpu_clock=ticks.__next__)
    assert pooled.policy == "pooled-reference"
    assert rr.requests == kv.requests == pooled.requests == len(trace)
    assert rr.prompt_tokens == kv.prompt_tokens == pooled.prompt_tokens
    assert kv.hit_ratio > rr.hit_ratio and kv.ttft_p99 < rr.ttft_p99
    assert kv.cached_tokens <= pooled.cached_tokens * 1.05 + 1
    assert kv.load_imbalance >= 1.0 and kv.decision_us_p50 == kv.decision_us_p99 == 1.0


# --workers is the released spelling of --engines.
@pytest.mark.parametrize("flag", ["--engines", "--workers"])
def test_simulate_cli_json_fields(tmp_path: Path, flag: str) -> None:
    cmd = [
        sys.executable, "-m", "router.cli", "simulate", "--trace", str(SAMPLE),
        flag, "4", "--capacity-tokens", "400000", "--json",
        *(arg for n in NAMES for arg in ("--policy", n)),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["policy"] for r in rows] == [*NAMES, "pooled-reference"]
    fields = {
        "policy", "requests", "prompt_tokens", "cached_tokens", "hit_ratio", "ttft_p50",
        "ttft_p99", "load_imbalance", "decision_us_p50", "decision_us_p99",
    }  # fmt: skip
    assert all(set(r) == fields for r in rows)


def test_simulate_cli_table_and_bad_policy(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "router.cli", "simulate", "--synthetic", "--requests", "150"]
    res = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].split()[:3] == ["policy", "requests", "hit_ratio"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npicker: sideways\n")
    res = subprocess.run([*base, "--policy", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "picker: must be one of" in res.stderr


def test_occupancy_reports_running_waiting_and_kv_use() -> None:
    from router.core.engine_model import EngineClock, EngineSpec, Occupancy

    spec = EngineSpec(capacity_tokens=10_000, max_batch=1, decode_tokens_per_s=10.0)
    clock, occ = EngineClock(spec), Occupancy(spec)
    a = clock.admit(0.0, 1000, 20)  # prefill 0.1 s, decode 2 s
    occ.add(a, 1000, 0)
    b = clock.admit(0.0, 500, 10)  # waits for the one slot
    occ.add(b, 600, 100)
    running, waiting, usage = occ.report(1.1)
    assert (running, waiting) == (1, 1)
    assert usage == pytest.approx((1000 + 10) / 10_000)
    assert occ.report(a.done + 0.01)[:2] == (1, 0)
    assert occ.report(b.done)[:2] == (0, 0)


def test_hotspot_workload_deterministic_with_a_burst_of_one_document() -> None:
    from router.core.workload import HotspotSpec, SyntheticSpec, hotspot

    spec = HotspotSpec(chat=SyntheticSpec(requests=300, rate_per_s=4.0), burst_start_s=20.0)
    first, second = list(hotspot(spec)), list(hotspot(spec))
    assert [r.engine_keys for r in first] == [r.engine_keys for r in second]
    doc = [r for r in first if r.session is None]
    in_burst = [r for r in first if 20.0 <= r.timestamp < 20.0 + spec.burst_seconds]
    assert doc and all(r.engine_keys[:50] == doc[0].engine_keys[:50] for r in doc)
    share = sum(1 for r in in_burst if r.session is None) / len(in_burst)
    assert share > spec.document_share


def test_simulate_engine_reports_change_the_decisions() -> None:
    from router.core.workload import HotspotSpec, SyntheticSpec, hotspot

    trace = list(hotspot(HotspotSpec(chat=SyntheticSpec(requests=400, rate_per_s=12.0))))
    policy = load_policy(preset_path("kv-aware"))
    spec = EngineSpec(capacity_tokens=200_000)
    blind = simulate_policy(policy, trace, Fleet(4, spec, report_interval=0.0))
    seen = simulate_policy(policy, trace, Fleet(4, spec, report_interval=0.5))
    assert blind.requests == seen.requests == 400
    assert (blind.cached_tokens, blind.ttft_p99) != (seen.cached_tokens, seen.ttft_p99)


def test_simulate_replicas_share_what_they_learn_deaf_ones_lose_hits() -> None:
    trace = list(synthetic(SyntheticSpec(requests=600, rate_per_s=8.0)))
    policy = load_policy(preset_path("kv-aware"))
    spec = EngineSpec(capacity_tokens=200_000)

    def run(replicas: Replicas) -> float:
        fleet = Fleet(4, spec, report_interval=0.5, replicas=replicas)
        return simulate_policy(policy, trace, fleet).hit_ratio

    one = run(Replicas(1))
    told = run(Replicas(4, lag=0.05, load_interval=0.05))
    # News that never arrives: each replica sees a quarter of every conversation.
    deaf = run(Replicas(4, lag=1e9))
    assert told >= 0.98 * one
    assert deaf < 0.95 * told


@pytest.mark.parametrize(
    ("count", "lag", "interval"), [(0, 0.0, 0.0), (2, -1.0, 0.0), (2, 0.0, -1.0)]
)
def test_replicas_bad_values_refused(count: int, lag: float, interval: float) -> None:
    with pytest.raises(ValueError, match="replicas"):
        Replicas(count, lag, interval)


def test_outside_bypass_is_seeded_round_robin_of_its_share() -> None:
    plan = Outside(0.25, seed=3).bypass(2000, 4)
    straight = [e for e in plan if e is not None]
    assert 400 < len(straight) < 600
    assert straight == [i % 4 for i in range(len(straight))]
    assert plan == Outside(0.25, seed=3).bypass(2000, 4) != Outside(0.25, seed=4).bypass(2000, 4)
    assert Outside().bypass(10, 4) == [None] * 10


@pytest.mark.parametrize(
    ("bypass", "restart"),
    [
        pytest.param(1.0, None, id="bypass_all"),
        pytest.param(-0.1, None, id="bypass_negative"),
        pytest.param(0.0, 1.5, id="restart_beyond_the_trace"),
    ],
)
def test_outside_bad_values_refused(bypass: float, restart: float | None) -> None:
    with pytest.raises(ValueError):
        Outside(bypass, restart)


def _two_turns(conversations: int) -> list[TraceRequest]:
    # Every conversation's first turn (two Mooncake blocks), then every second turn (three).
    first = [
        {"timestamp": c, "input_length": 1024, "output_length": 1, "hash_ids": [100 + c, c]}
        for c in range(conversations)
    ]
    second = [
        {**r, "timestamp": 1000 + c, "input_length": 1536, "hash_ids": [100 + c, c, 500 + c]}
        for c, r in enumerate(first)
    ]
    return [parse_record(r, f"r{i}") for i, r in enumerate([*first, *second])]


def test_simulate_precise_index_follows_traffic_that_bypassed_the_router() -> None:
    trace = _two_turns(40)
    kv = load_policy(preset_path("kv-aware"))
    seen = Fleet(4, SPEC)
    approx, precise = (simulate_policy(kv, trace, seen, precise=p) for p in (False, True))
    # The router sees everything: both indexes know the same.
    assert approx.cached_tokens == precise.cached_tokens > 0
    assert precise.policy == "kv-aware (precise)"
    half = Fleet(4, SPEC, outside=Outside(0.5, seed=2))
    approx, precise = (simulate_policy(kv, trace, half, precise=p) for p in (False, True))
    # A routed second turn finds the engine its bypassed first turn went to only with events.
    assert precise.cached_tokens > approx.cached_tokens
    plan = Outside(0.5, seed=2).bypass(len(trace), 4)
    routed_seconds = sum(1 for e in plan[40:] if e is None)
    assert precise.cached_tokens >= routed_seconds * 1024


def test_simulate_restart_empties_engine_zero() -> None:
    trace = _two_turns(40)
    kv = load_policy(preset_path("kv-aware"))
    plain = simulate_policy(kv, trace, Fleet(4, SPEC), precise=True)
    restarted = Fleet(4, SPEC, outside=Outside(restart_at=0.5))
    for precise in (False, True):
        got = simulate_policy(kv, trace, restarted, precise=precise)
        # Engine 0 lost the first turns it held: their second turns miss, wherever they go.
        assert got.cached_tokens < plain.cached_tokens


def test_simulate_cli_bypass_restart_and_both_indexes() -> None:
    cmd = [
        sys.executable, "-m", "router.cli", "simulate", "--trace", str(SAMPLE), "--engines",
        "4", "--bypass-share", "0.2", "--restart-at", "0.5", "--index", "approximate",
        "precise", "--json",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["policy"] for r in rows] == ["kv-aware", "kv-aware (precise)", "pooled-reference"]
    bad = subprocess.run([*cmd, "--bypass-share", "1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "bypass share" in bad.stderr


def test_simulate_cli_replicas_and_their_bad_values() -> None:
    base = [sys.executable, "-m", "router.cli", "simulate", "--synthetic", "--requests", "300"]
    base += ["--json"]

    def hit_ratio(*flags: str) -> float:
        res = subprocess.run([*base, *flags], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert res.returncode == 0, res.stderr
        return float(json.loads(res.stdout)[0]["hit_ratio"])

    told = hit_ratio("--replicas", "4", "--gossip-lag", "0.02", "--load-interval", "0.05")
    deaf = hit_ratio("--replicas", "4", "--gossip-lag", "1e9")
    assert deaf < told
    bad = subprocess.run([*base, "--replicas", "0"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "replicas must be at least 1" in bad.stderr
