"""Big fleets: only a shortlist of candidates is scored, with the same outcome where it matters."""

from __future__ import annotations

from typing import Any

import pytest

from router.core import decision
from router.core.decision import RoutingCore
from router.core.load import EngineReport
from router.presets import preset_path
from router.yaml_files import load_policy

ENGINES = [f"http://e{i}:8000" for i in range(40)]


def core() -> RoutingCore:
    r = RoutingCore(load_policy(preset_path("kv-aware")))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def body(text: str) -> dict[str, Any]:
    return {"model": "m", "prompt": text * 300}


@pytest.mark.parametrize("prompt", ["alpha ", "beta ", "gamma delta "])
def test_shortlist_cold_prefix_same_pick_as_scoring_everyone(
    prompt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = core().decide(body(prompt), ENGINES, now=0.0)
    monkeypatch.setattr(decision, "SHORTLIST_ABOVE", 10_000)
    full = core().decide(body(prompt), ENGINES, now=0.0)
    assert len(short.inputs.candidates) < len(ENGINES) == len(full.inputs.candidates)
    assert short.engine == full.engine


def test_shortlist_holder_kept_and_fallbacks_cover_every_engine() -> None:
    r = core()
    d = r.decide(body("shared "), ENGINES, now=0.0)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, 0.0)
    r.record(lease, 0.0)
    r.release(lease)
    again = r.decide(body("shared "), ENGINES, now=1.0)
    assert again.engine == d.engine and again.overlap_ratio > 0.9
    assert sorted(again.plan()) == sorted(ENGINES)


def test_shortlist_engine_reporting_a_queue_passed_over() -> None:
    r = core()
    d = r.decide(body("hot "), ENGINES, now=0.0)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, 0.0)
    r.record(lease, 0.0)
    r.release(lease)
    r.loads.engine_report(d.engine, EngineReport(running=32, waiting=50), at=1.0)
    again = r.decide(body("hot "), ENGINES, now=1.1)
    assert again.engine != d.engine
    assert d.engine in again.fallbacks


def test_shortlist_replicas_with_the_same_view_agree() -> None:
    picks = set()
    for _ in range(3):
        r = core()
        for i, e in enumerate(ENGINES[:10]):
            r.loads.engine_report(e, EngineReport(running=i % 3), at=0.0)
        picks.add(r.decide(body("omega "), ENGINES, now=0.5).engine)
    assert len(picks) == 1
