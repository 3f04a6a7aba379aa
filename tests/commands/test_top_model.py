"""``kvrouter top``'s model: canned answers of a real router (tests/data/top) in, rows out.

The files were taken from ``kvrouter serve`` in front of two engine-sims (one serving
``sim-model``, six requests; one ``other-model``, one request), with the admin token.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from router.commands.top_model import (
    SORTS,
    EngineSample,
    RouterSample,
    fleet_view,
    next_of,
    sample,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "top"
METRICS = (DATA / "metrics.txt").read_text()
BACKENDS: dict[str, Any] = json.loads((DATA / "backends.json").read_text())
READY: dict[str, Any] = json.loads((DATA / "ready.json").read_text())
MODELS: dict[str, Any] = json.loads((DATA / "models.json").read_text())
SIM, OTHER = (b["url"] for b in BACKENDS["backends"])


def canned(at: float = 0.0, metrics: str = METRICS, backends: Any = BACKENDS) -> RouterSample:
    return sample("http://router:8000", at, metrics, READY, MODELS, backends)


def test_sample_reads_a_real_routers_answers() -> None:
    r = canned()
    assert (r.error, r.ready, r.policy) == ("", True, "kv-aware")
    assert r.models == ("other-model", "sim-model")
    assert set(r.engines) == {SIM, OTHER}
    sim = r.engines[SIM]
    assert (sim.healthy, sim.state, sim.models) == (True, "healthy", ("sim-model",))
    assert (sim.attempts, sim.failed, sim.inflight) == (6.0, 0.0, 0.0)
    assert (sim.running, sim.waiting, sim.kv_usage) == (0.0, 0.0, 0.0)
    assert r.engines[OTHER].attempts == 1.0
    assert (r.requests, r.prompt_tokens, r.cached_tokens) == (7.0, 2168.0, 1760.0)
    # This router exports no routing-quality counters: they stay unknown, never 0.
    assert (r.reachable, sim.reachable, sim.achieved) == (None, None, None)


def test_sample_without_admin_answers_falls_back_to_metrics() -> None:
    r = sample("http://router:8000", 0.0, METRICS)
    assert r.engines[SIM].healthy and r.engines[SIM].state == "" and r.engines[SIM].models == ()
    assert (r.ready, r.models) == (False, ())


def test_sample_reads_routing_quality_counters_when_exported() -> None:
    quality = (
        "# TYPE kvrouter_prefix_reachable_tokens_total counter\n"
        f'kvrouter_prefix_reachable_tokens_total{{engine="{SIM}"}} 1800.0\n'
        f'kvrouter_prefix_reachable_tokens_total{{engine="{OTHER}"}} 0.0\n'
        "# TYPE kvrouter_prefix_achieved_tokens_total counter\n"
        f'kvrouter_prefix_achieved_tokens_total{{engine="{SIM}"}} 1760.0\n'
        f'kvrouter_prefix_achieved_tokens_total{{engine="{OTHER}"}} 0.0\n'
    )
    r = canned(metrics=METRICS + quality)
    assert (r.reachable, r.achieved) == (1800.0, 1760.0)
    view = fleet_view([r])
    rows = {row.engine: row for row in view.rows}
    assert rows[SIM].got == pytest.approx(1760 / 1800)
    assert rows[OTHER].got is None  # nothing reachable: no ratio
    assert view.reachable_ratio == pytest.approx(1800 / 2168)
    assert view.hit_ratio == pytest.approx(1760 / 2168)


def test_sample_of_garbage_is_an_error_not_a_crash() -> None:
    assert canned(metrics="<html>502 Bad Gateway</html>").error == "no metrics"
    assert canned(backends={"backends": "nope"}).engines[SIM].state == ""


def _later(r: RouterSample, seconds: float, **engine_changes: dict[str, Any]) -> RouterSample:
    engines = {u: replace(e, **engine_changes.get(u, {})) for u, e in r.engines.items()}
    return replace(r, at=r.at + seconds, engines=engines, requests=r.requests + 10)


def test_fleet_view_rates_from_two_refreshes() -> None:
    first = canned(at=100.0)
    second = _later(first, 2.0, **{SIM: {"attempts": 16.0, "failed": 2.0}})
    view = fleet_view([second], [first])
    rows = {row.engine: row for row in view.rows}
    assert rows[SIM].rps == pytest.approx(5.0) and rows[SIM].failed_rps == pytest.approx(1.0)
    assert rows[OTHER].rps == 0.0
    assert view.rps == pytest.approx(5.0)
    assert "req/s" in rows[SIM].trouble()
    assert fleet_view([first]).rows[0].rps is None  # one refresh: no rate yet


def test_fleet_view_counter_reset_is_no_negative_rate() -> None:
    first = canned(at=100.0)
    restarted = _later(first, 1.0, **{SIM: {"attempts": 0.0}})
    assert {r.engine: r.rps for r in fleet_view([restarted], [first]).rows}[SIM] == 0.0


def test_fleet_view_merges_replicas_of_a_gossiping_fleet() -> None:
    a = canned()
    b = replace(
        canned(),
        url="http://router-b:8000",
        engines={
            SIM: replace(a.engines[SIM], inflight=3.0, healthy=False, state="ejected"),
            OTHER: replace(a.engines[OTHER], inflight=1.0, kv_usage=0.95, waiting=2.0),
        },
    )
    rows = {row.engine: row for row in fleet_view([a, b]).rows}
    assert rows[SIM].inflight == 3.0
    assert (rows[SIM].health, rows[SIM].healthy) == ("1/2 healthy", False)
    assert rows[OTHER].kv_usage == 0.95  # the engine's own report: the freshest, not a sum
    assert rows[OTHER].trouble() == {"kv", "waiting"}
    assert rows[SIM].trouble() == {"health"}


def test_fleet_view_unreachable_router_listed_but_not_counted() -> None:
    down = RouterSample("http://router-b:8000", 0.0, error="connection refused")
    view = fleet_view([canned(), down])
    assert [r.url for r in view.routers] == ["http://router:8000", "http://router-b:8000"]
    assert {row.engine for row in view.rows} == {SIM, OTHER}


def test_fleet_view_model_filter_keeps_the_engines_serving_it() -> None:
    view = fleet_view([canned()], model="other-model")
    assert [row.engine for row in view.rows] == [OTHER]
    assert view.engines_total == 2


@pytest.mark.parametrize("sort", SORTS)
def test_fleet_view_sorted_busiest_first_by_the_column(sort: str) -> None:
    r = canned()
    busy = EngineSample("http://zz-busy:1", True, inflight=9, waiting=4, kv_usage=0.5)
    r = replace(r, engines={**r.engines, busy.url: busy})
    first = fleet_view([r], sort=sort).rows[0].engine
    assert first == (min(r.engines) if sort in ("engine", "req/s") else busy.url)


def test_next_of_cycles_and_starts_over() -> None:
    options = (None, "a", "b")
    assert [next_of(options, x) for x in options] == ["a", "b", None]
    assert next_of(SORTS, "missing") == SORTS[0]
