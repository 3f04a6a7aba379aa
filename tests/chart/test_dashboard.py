"""The Grafana dashboard: valid JSON with the sidecar label, querying only exported metrics.

The exported metrics are the hand-written ``ROUTER_METRICS``; test_dashboard_live.py checks
the same queries against a running router.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.support import (
    CHART_DIR,
    ROUTER_METRICS,
    dashboard_queries,
    promql_metric_names,
    rendered,
    series_names,
)


def dashboard() -> dict[str, Any]:
    cm = rendered("defaults").one("ConfigMap", "edge-kvrouter-dashboard")
    parsed: dict[str, Any] = json.loads(cm["data"]["kvrouter.json"])
    return parsed


def test_dashboard_configmap_is_valid_json_with_sidecar_label() -> None:
    cm = rendered("defaults").one("ConfigMap", "edge-kvrouter-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = dashboard()
    assert board["uid"] == "kvrouter" and board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (code) (rate(kvrouter_requests_total{code=~"5.."}[5m]))',
            {"kvrouter_requests_total"},
        ),
        (
            "histogram_quantile(0.9, sum by (le) (rate(kvrouter_ttft_seconds_bucket[$__range])))",
            {"kvrouter_ttft_seconds_bucket"},
        ),
        ("a_total / on(pod) group_left(x) b and c offset 5m", {"a_total", "b", "c"}),
        ('count(min by (backend) (up{job=~"$job"}) == 1)', {"up"}),
        (
            'label_values(kvrouter_requests_total{namespace=~"$ns"}, job)',
            {"kvrouter_requests_total"},
        ),
        ("sum(rate(x_sum[1m])) / sum(rate(x_count[1m])) * 1e3", {"x_sum", "x_count"}),
    ],
    ids=[
        "labels-and-range",
        "histogram",
        "binary-ops",
        "grafana-variable",
        "label-values",
        "numbers",
    ],
)
def test_promql_metric_names_expression_finds_only_metrics(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_dashboard_queries_use_only_exported_metrics() -> None:
    allowed = series_names(ROUTER_METRICS)
    unknown = {
        f"{where}: {name}"
        for where, expr in dashboard_queries(dashboard())
        for name in promql_metric_names(expr)
        if name not in allowed
    }
    assert unknown == set()


@pytest.mark.parametrize(
    ("topic", "series"),
    [
        ("requests", "kvrouter_requests_total"),
        ("ttft", "kvrouter_ttft_seconds_bucket"),
        ("hit-ratio-cached", "kvrouter_cached_tokens_total"),
        ("hit-ratio-prompt", "kvrouter_prompt_tokens_total"),
        ("backend-load", "kvrouter_backend_inflight_requests"),
        ("backend-health", "kvrouter_backend_healthy"),
        ("gossip", "kvrouter_gossip_peers"),
        ("policy-reloads", "kvrouter_policy_reloads_total"),
    ],
)
def test_dashboard_topic_has_a_panel(topic: str, series: str) -> None:
    used = {n for _, expr in dashboard_queries(dashboard()) for n in promql_metric_names(expr)}
    assert series in used, topic


def test_dashboard_file_in_chart_is_the_one_rendered() -> None:
    assert json.loads((CHART_DIR / "dashboards" / "kvrouter.json").read_text()) == dashboard()
