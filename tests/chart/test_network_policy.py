"""The NetworkPolicy: gossip only from router pods; /metrics and the API from their own lists."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.support import (
    ROUTER_METRICS_PORT,
    SCENARIO_IDS,
    container_port,
    labels_match,
    merged_values,
    render,
    rendered,
    values_of,
)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_network_policy_scenario_gossip_port_only_from_router_pods(scenario: str) -> None:
    out = rendered(scenario)
    policies = out.of_kind("NetworkPolicy")
    if not values_of(scenario).get("networkPolicy", {}).get("enabled", True):
        assert policies == []
        return
    (policy,) = policies
    pod_labels = out.router_deployment()["spec"]["template"]["metadata"]["labels"]
    assert labels_match(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    gossip_rules = [
        r for r in policy["spec"]["ingress"] if any(p["port"] == "gossip" for p in r["ports"])
    ]
    if not out.router_config()["gossip"]["enabled"]:
        assert gossip_rules == []
        return
    (rule,) = gossip_rules
    assert [p["port"] for p in rule["ports"]] == ["gossip"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    assert peer["podSelector"]["matchLabels"] == policy["spec"]["podSelector"]["matchLabels"]


def port_rules(policy: dict[str, Any], port: str) -> list[dict[str, Any]]:
    return [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])]


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_network_policy_scenario_metrics_port_from_metrics_from(scenario: str) -> None:
    """/metrics has its own port: scrapers are admitted there, as networkPolicy.metricsFrom says."""
    out = rendered(scenario)
    policies = out.of_kind("NetworkPolicy")
    if not values_of(scenario).get("networkPolicy", {}).get("enabled", True):
        assert policies == []
        return
    (policy,) = policies
    network = merged_values(values_of(scenario))["networkPolicy"]
    (rule,) = port_rules(policy, "metrics")
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert container_port(out.router_container(), "metrics") == ROUTER_METRICS_PORT
    assert rule.get("from", []) == network["metricsFrom"]
    (http,) = port_rules(policy, "http")
    assert [p["port"] for p in http["ports"]] == ["http"]


@pytest.mark.parametrize(
    ("metrics_from", "http_from"),
    [
        ([], []),
        (
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            [],
        ),
        ([], [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}]),
    ],
    ids=["both-open", "metrics-restricted", "http-restricted"],
)
def test_network_policy_metrics_from_restricts_only_the_metrics_port(
    metrics_from: list[dict[str, Any]], http_from: list[dict[str, Any]]
) -> None:
    out = render({"networkPolicy": {"metricsFrom": metrics_from, "httpFrom": http_from}})
    (policy,) = out.of_kind("NetworkPolicy")
    (metrics,) = port_rules(policy, "metrics")
    (http,) = port_rules(policy, "http")
    # An empty list admits everyone: a rule without "from".
    assert metrics.get("from", []) == metrics_from
    # httpFrom also admits the `helm test` pod, which calls /ready; it never reads /metrics.
    assert http.get("from", [])[: len(http_from)] == http_from
    assert ("from" in http) is bool(http_from)
