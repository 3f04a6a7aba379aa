"""Probes, Services and the `helm test` pod call endpoints the router serves, on its ports."""

from __future__ import annotations

import re

import pytest

from tests.chart.support import (
    CLUSTER_DOMAIN,
    NAMESPACE,
    ROUTER_HTTP_PATHS,
    SCENARIO_IDS,
    container_port,
    labels_match,
    rendered,
)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_probes_scenario_call_router_endpoints_on_its_port(scenario: str) -> None:
    out = rendered(scenario)
    container = out.router_container()
    listen_port = out.router_config()["listen"]["port"]
    expected = {"livenessProbe": "/health", "readinessProbe": "/ready", "startupProbe": "/health"}
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["path"] in ROUTER_HTTP_PATHS
        assert container_port(container, get["port"]) == listen_port


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_service_scenario_http_and_metrics_reach_their_router_ports(scenario: str) -> None:
    """The API port answers 404 for /metrics: "metrics" must reach listen.metrics_port."""
    out = rendered(scenario)
    container = out.router_container()
    listen = out.router_config()["listen"]
    pod_labels = out.router_deployment()["spec"]["template"]["metadata"]["labels"]
    service = out.one("Service", out.router_deployment()["metadata"]["name"])
    assert labels_match(service["spec"]["selector"], pod_labels)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "metrics"}
    assert container_port(container, ports["http"]["targetPort"]) == listen["port"]
    assert container_port(container, ports["metrics"]["targetPort"]) == listen["metrics_port"]
    assert listen["metrics_port"] not in {0, listen["port"]}


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_helm_test_pod_scenario_calls_ready_through_the_service(scenario: str) -> None:
    out = rendered(scenario)
    pods = out.of_kind("Pod")
    (pod,) = pods
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    url = pod["spec"]["containers"][0]["command"][3]
    match = re.fullmatch(r"http://([^.]+)\.([^.]+)\.svc\.([^:]+):(\d+)(/\S*)", url)
    assert match, url
    name, ns, domain, port, path = match.groups()
    service = out.one("Service", name)
    assert (ns, domain, path) == (NAMESPACE, CLUSTER_DOMAIN, "/ready")
    assert int(port) in {p["port"] for p in service["spec"]["ports"] if p["name"] == "http"}
    # The test pod must not pass for a router replica.
    assert not labels_match(service["spec"]["selector"], pod["metadata"]["labels"])
