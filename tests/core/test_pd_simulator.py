"""The disaggregated simulator: four fleets, every request accounted for, the transfer timed."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys

import pytest

from router.core.disaggregation import WHYS, DisaggSettings
from router.core.engine_model import EngineSpec
from router.core.pd_deciders import FLEETS, LLMD_THRESHOLD_TOKENS, decider
from router.core.pd_simulator import Objectives, PdFleet, simulate_fleet, simulate_pd
from router.core.simulator import Fleet, simulate_policy
from router.core.workload import SyntheticSpec, from_body, synthetic
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.support import ROOT

POLICY = load_policy(preset_path("kv-aware"))
SPEC = EngineSpec(capacity_tokens=200_000, decode_stall=1.0)
# Small and busy: 300 chat requests at 6 a second on 4 engines.
TRACE = list(synthetic(SyntheticSpec(requests=300, conversations=60, rate_per_s=6.0, seed=3)))


def fleet(link_gbps: float = 400.0, **kw: float) -> PdFleet:
    return PdFleet(2, 2, SPEC, DisaggSettings(link_gbps=link_gbps), **kw)  # type: ignore[arg-type]


def test_every_fleet_accounts_for_every_request() -> None:
    rows = simulate_pd(POLICY, TRACE, fleet())
    assert [r.fleet for r in rows] == list(FLEETS)
    for r in rows:
        assert r.requests == len(TRACE) and sum(r.paths.values()) == len(TRACE)
        assert 0 <= r.slo_attainment <= 1 and 0 <= r.hit_ratio <= 1
        assert r.ttft_p50 <= r.ttft_p99 and r.tpot_p50 <= r.tpot_p99
        assert all(k.split(":")[0] in ("whole", "split") for k in r.paths)
    by = {r.fleet: r for r in rows}
    assert by["aggregated"].paths == {"whole:aggregated": len(TRACE)}
    assert by["aggregated"].prefill_engines == 0 and by["kvrouter"].prefill_engines == 2
    assert by["always-split"].paths == {"split:decider-always": len(TRACE)}
    assert by["always-split"].split_share == 1.0 and by["always-split"].transfer_gb > 0
    assert set(by["threshold"].paths) <= {"split:over-threshold", "whole:under-threshold"}
    assert {k.split(":")[1] for k in by["kvrouter"].paths} <= set(WHYS)
    # Nothing decodes beside a prefill on a decode engine that only receives.
    assert by["always-split"].tpot_p99 == pytest.approx(1 / SPEC.decode_tokens_per_s)


def test_kvrouter_falls_back_to_whole_at_a_slow_link() -> None:
    def at(gbps: float) -> PdFleet:
        # Every turn priced by the link, however few its new tokens.
        return PdFleet(2, 2, SPEC, DisaggSettings(link_gbps=gbps, stay_below_tokens=0))

    slow = simulate_fleet("kvrouter", POLICY, TRACE, at(0.05), Objectives())
    fast = simulate_fleet("kvrouter", POLICY, TRACE, at(7200.0), Objectives())
    assert slow.split_share < 0.1 < fast.split_share
    assert slow.transfer_gb < fast.transfer_gb


def test_a_decode_pool_too_small_for_the_answers_hands_them_to_the_prefill_pool() -> None:
    # One decode engine of 4 slots, answers of 5 s, two new 6,000-token prompts a second:
    # the decode pool holds 0.8 answers a second, three prefill engines' free slots the rest.
    spec = dataclasses.replace(SPEC, max_batch=4)
    rng = random.Random(5)
    trace = [
        from_body(
            {
                "model": "m",
                "prompt": " ".join(f"w{rng.randrange(10**6)}" for _ in range(3000)),
                "max_tokens": 200,
                "timestamp": i * 0.5,
            },
            f"r{i}",
        )
        for i in range(120)
    ]
    f = PdFleet(3, 1, spec, DisaggSettings(link_gbps=400))
    goal = Objectives(2.0, 0.05, 1 / spec.prefill_tokens_per_s)
    kv, split = (simulate_fleet(n, POLICY, trace, f, goal) for n in ("kvrouter", "always-split"))
    assert kv.paths.get("whole:prefill-engine-cheaper", 0) > len(trace) / 2
    # Splitting everything queues for the decode engine's slots without end.
    assert split.ttft_p50 > 10 * kv.ttft_p50
    assert kv.goodput > 10 * split.goodput


def test_a_split_requests_first_token_waits_for_prefill_and_transfer() -> None:
    body = {"model": "m", "prompt": "x" * 40_000, "max_tokens": 10, "timestamp": 0.0}
    req = from_body(body, "one")
    link = DisaggSettings(link_gbps=10.0)
    f = PdFleet(1, 1, SPEC, link, report_interval=0.0)
    r = simulate_fleet("always-split", POLICY, [req], f, Objectives())
    prefill = req.prompt_tokens / SPEC.prefill_tokens_per_s  # nothing cached anywhere yet
    moved = link.transfer_seconds(req.prompt_tokens)
    assert moved == pytest.approx(10_000 * 131_072 * 8 / 10e9)
    assert r.ttft_p50 == pytest.approx(prefill + moved)
    assert r.transfer_gb == pytest.approx(link.transfer_bytes(req.prompt_tokens) / 1e9)
    assert r.tpot_p50 == pytest.approx(1 / SPEC.decode_tokens_per_s)
    # The decode engine holds the blocks it received: the same prompt again moves nothing
    # but the last token the engine always computes.
    again = [req, dataclasses.replace(req, timestamp=5.0)]
    twice = simulate_fleet("always-split", POLICY, again, f, Objectives())
    assert twice.transfer_gb == pytest.approx(link.transfer_bytes(req.prompt_tokens + 1) / 1e9)


def test_the_aggregated_fleet_without_interference_is_the_simulators() -> None:
    spec = EngineSpec(capacity_tokens=200_000)
    f = PdFleet(2, 2, spec, report_interval=0.5)
    mine = simulate_fleet("aggregated", POLICY, TRACE, f, Objectives())
    theirs = simulate_policy(POLICY, TRACE, Fleet(4, spec, report_interval=0.5))
    assert mine.hit_ratio == theirs.hit_ratio
    assert (mine.ttft_p50, mine.ttft_p99) == (theirs.ttft_p50, theirs.ttft_p99)


def test_goodput_counts_requests_meeting_both_objectives() -> None:
    lax = simulate_fleet("aggregated", POLICY, TRACE, fleet(), Objectives(1e6, 1e6))
    span = TRACE[-1].timestamp - TRACE[0].timestamp
    assert lax.slo_attainment == 1.0 and lax.goodput == pytest.approx(len(TRACE) / span)
    tight = simulate_fleet("aggregated", POLICY, TRACE, fleet(), Objectives(1e6, 1e-6))
    assert tight.goodput == 0.0
    allowed = Objectives(1.0, 1.0, ttft_per_token=0.001)
    assert allowed.met(2.9, 0.5, 2000) and not allowed.met(3.1, 0.5, 2000)


@pytest.mark.parametrize(
    "kwargs",
    [{"prefill_engines": 0}, {"decode_engines": 0}, {"speedup": 0.0}, {"threshold_tokens": -1}],
)
def test_fleets_refuse_nonsense(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        PdFleet(**{"prefill_engines": 1, "decode_engines": 1, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decider("sideways", DisaggSettings(), LLMD_THRESHOLD_TOKENS)


def test_simulate_cli_runs_a_disaggregated_fleet() -> None:
    cmd = [
        sys.executable, "-m", "router.cli", "simulate", "--synthetic", "--requests", "120",
        "--prefill-engines", "2", "--decode-engines", "1", "--link-gbps", "25",
        "--ttft-objective", "1e6", "--tpot-objective", "1e6", "--ttft-per-token", "0.001", "--json",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["fleet"] for r in rows] == list(FLEETS)
    assert all(r["requests"] == 120 and r["link_gbps"] == 25 for r in rows)
    assert rows[1]["prefill_engines"] == 2 and rows[1]["decode_engines"] == 1
    assert all(r["slo_attainment"] == 1.0 for r in rows)  # objectives no request misses
    table = subprocess.run(cmd[:-1], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert table.returncode == 0 and table.stdout.split()[:3] == ["fleet", "goodput", "slo"]
    half = subprocess.run(cmd[:9], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert half.returncode == 1 and "go together" in half.stderr
