"""The Deployment's shape: non-root and read-only, spread, autoscaled, named within DNS limits.

Also the objects around it: the PodDisruptionBudget, the ServiceAccount, the ServiceMonitor
when its CRD is served, and NOTES.txt.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.chart.support import (
    NAMESPACE,
    ROUTER_HTTP_PATHS,
    ROUTER_METRICS_PORT,
    SCENARIO_IDS,
    SERVICE_MONITOR_API,
    container_port,
    labels_match,
    render,
    rendered,
)
from tests.image.support import dockerfile_uid


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_deployment_scenario_runs_non_root_read_only(scenario: str) -> None:
    out = rendered(scenario)
    pod = out.router_deployment()["spec"]["template"]["spec"]
    container = out.router_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_uid()
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]
    assert pod["automountServiceAccountToken"] is False
    # A read-only root still needs somewhere to write temporary files.
    _, tmp = out.mount_for_file("/tmp/x")
    assert "emptyDir" in tmp


@pytest.mark.parametrize(
    ("scenario", "spread_keys"),
    [
        ("defaults", ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]),
        ("static-backends", []),
        ("dns-autoscaling", ["topology.kubernetes.io/zone"]),
    ],
)
def test_topology_spread_scenario_selects_router_pods(
    scenario: str, spread_keys: list[str]
) -> None:
    template = rendered(scenario).router_deployment()["spec"]["template"]
    constraints = template["spec"].get("topologySpreadConstraints", [])
    assert [c["topologyKey"] for c in constraints] == spread_keys
    for c in constraints:
        assert labels_match(c["labelSelector"]["matchLabels"], template["metadata"]["labels"])


@pytest.mark.parametrize(
    ("values", "replicas", "hpa"),
    [
        ({"replicaCount": 4}, 4, False),
        ({"replicaCount": 4, "autoscaling": {"enabled": True}}, None, True),
    ],
    ids=["fixed", "autoscaled"],
)
def test_deployment_replicas_autoscaling_owned_by_hpa(
    values: dict[str, Any], replicas: int | None, hpa: bool
) -> None:
    out = render(values)
    deployment = out.router_deployment()
    assert deployment["spec"].get("replicas") == replicas
    hpas = out.of_kind("HorizontalPodAutoscaler")
    assert bool(hpas) is hpa
    if hpa:
        target = hpas[0]["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_pdb_default_selects_router_pods() -> None:
    out = rendered("defaults")
    pdb = out.one("PodDisruptionBudget")
    labels = out.router_deployment()["spec"]["template"]["metadata"]["labels"]
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], labels)
    assert labels_match(out.router_deployment()["spec"]["selector"]["matchLabels"], labels)


def test_service_account_default_is_the_pods() -> None:
    out = rendered("defaults")
    account = out.one("ServiceAccount")
    pod = out.router_deployment()["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


@pytest.mark.parametrize(
    "release",
    ["r", "a-very-long-release-name-that-goes-on-and-on-well-past-the-dns-label-limit"],
    ids=["short", "long"],
)
def test_names_release_length_fit_dns_labels(release: str) -> None:
    out = render({}, release=release)
    label = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for obj in out.objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and label.match(name), name
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63, value
    names = [o["metadata"]["name"] for o in out.objects]
    assert len(set(zip(names, (o["kind"] for o in out.objects), strict=True))) == len(names)


@pytest.mark.parametrize(
    ("values", "present"),
    [
        ({}, False),
        ({"serviceMonitor": {"enabled": False}}, False),
    ],
    ids=["no-crd", "disabled"],
)
def test_service_monitor_without_crd_or_disabled_absent(
    values: dict[str, Any], present: bool
) -> None:
    assert bool(render(values).of_kind("ServiceMonitor")) is present


def test_service_monitor_crd_present_scrapes_the_metrics_port() -> None:
    out = render({}, api_versions=[SERVICE_MONITOR_API, "monitoring.coreos.com/v1"])
    monitor = out.one("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and "/metrics" in ROUTER_HTTP_PATHS
    scraped = [
        s
        for s in out.of_kind("Service")
        if labels_match(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        and any(p["name"] == endpoint["port"] for p in s["spec"]["ports"])
    ]
    assert [s["metadata"]["name"] for s in scraped] == [out.router_deployment()["metadata"]["name"]]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    # The scraped Service port leads to the one container port that serves /metrics.
    (port,) = [p for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    target = container_port(out.router_container(), port["targetPort"])
    assert target == out.router_config()["listen"]["metrics_port"] == ROUTER_METRICS_PORT


def test_notes_default_explain_policy_edit_and_reload_metric() -> None:
    notes = rendered("defaults").notes
    assert "kubectl -n inference edit configmap edge-kvrouter" in notes
    assert "kvrouter_policy_reloads_total" in notes
    assert "no backends are configured" in notes


def test_notes_backends_set_no_warning() -> None:
    assert "no backends" not in rendered("static-backends").notes
