"""The Grafana dashboard against a live router: every series it queries is really exported.

The chart tests check the dashboard's queries against ``ROUTER_METRICS``, a list written by
hand; this test checks them against what ``kvrouter serve`` actually puts on ``/metrics``
after serving a few requests through one ``engine-sim --fast``, all on loopback. The router
gossips (alone: its gossip counters exist as soon as gossip is on).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.support import CHART_DIR, dashboard_queries, promql_metric_names
from tests.support import Proc, free_port, start_kvrouter

pytestmark = pytest.mark.integration

DASHBOARD = CHART_DIR / "dashboards" / "kvrouter.json"
MODEL = "sim-model"
# Several of the kv-aware policy's blocks, so the repeated prompt overlaps what was routed.
SYSTEM = " ".join(f"rule{i} answer briefly and cite the source" for i in range(80))
GOSSIP_ENV = {"KVROUTER_GOSSIP_SECRET": "dashboard-live-test-secret-0123"}


def dashboard_series() -> set[str]:
    """Every series name a query or a variable of the dashboard reads."""
    board = json.loads(DASHBOARD.read_text())
    return {name for _, expr in dashboard_queries(board) for name in promql_metric_names(expr)}


def post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        data: bytes = r.read()
    return data


def exported_series(router: Proc) -> set[str]:
    """The sample names of one scrape of the router's /metrics."""
    with urllib.request.urlopen(f"{router.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def drive(router: Proc) -> None:
    """Streamed and plain chat and a completion, the chat prompt twice (a cache hit)."""
    for question, stream in (("first", True), ("second", True), ("third", False)):
        chat = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{question} question"},
            ],
            "max_tokens": 4,
            "stream": stream,
        }
        if stream:
            chat["stream_options"] = {"include_usage": True}
            assert b"[DONE]" in post(f"{router.url}/v1/chat/completions", chat)
        else:
            assert json.loads(post(f"{router.url}/v1/chat/completions", chat))["usage"]
    completion = {"model": MODEL, "prompt": SYSTEM, "max_tokens": 4}
    assert json.loads(post(f"{router.url}/v1/completions", completion))["choices"]


def test_dashboard_series_live_router_exports_every_one(procs: list[Proc], tmp_path: Path) -> None:
    wanted = dashboard_series()
    assert wanted, f"no metric names found in the queries of {DASHBOARD.name}"
    engine = start_kvrouter(["engine-sim", "--fast", "--model", MODEL], tmp_path)
    procs.append(engine)
    args = ["serve", "--host", "127.0.0.1", "--backend", engine.url, "--log-level", "warning"]
    args += ["--gossip-port", str(free_port())]
    router = start_kvrouter(args, tmp_path, ready_path="/ready", env=GOSSIP_ENV)
    procs.append(router)

    drive(router)
    missing = wanted - exported_series(router)
    assert missing == set(), (
        f"{DASHBOARD.name} queries series the running router does not export: {sorted(missing)}"
    )
