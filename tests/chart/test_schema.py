"""The chart renders, lints strictly and validates against Kubernetes' schemas, in every scenario.

Every scenario (the chart defaults and each ci/*-values.yaml) is rendered, linted with
``--strict`` and validated manifest by manifest against two Kubernetes versions; the values
schema is closed, refuses a bad value naming its key, and the render refuses values that
contradict each other, giving the reason.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import helm_python
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.chart.support import (
    CHART_DIR,
    CI_VALUES,
    CRD_KINDS,
    KUBE_VERSIONS,
    NAMESPACE,
    ROOT,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS_PORT,
    SCENARIO_IDS,
    lint_findings,
    render,
    rendered,
    values_of,
)


def test_ci_scenarios_exist() -> None:
    assert len(CI_VALUES) >= 3, "the chart's ci/ folder should hold the CI scenarios"


# --- Helm: render, lint, Kubernetes schemas -------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_chart_render_scenario_produces_core_objects(scenario: str) -> None:
    kinds = {o["kind"] for o in rendered(scenario).objects}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= kinds


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_chart_lint_strict_scenario_has_no_findings(scenario: str) -> None:
    assert lint_findings(values_of(scenario)) == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_chart_manifests_scenario_valid_against_kubernetes_schemas(
    scenario: str, kube_version: str
) -> None:
    out = rendered(scenario)
    checked = 0
    for obj, source in zip(out.objects, out.sources, strict=True):
        if obj["kind"] in CRD_KINDS:
            continue
        where = f"{source} {obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{where}: {path}: {e.message}")
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("Deployment", lambda d: d["spec"].update(replica=2)),
        ("Deployment", lambda d: d["spec"].update(replicas="two")),
    ],
    ids=["unknown-field", "wrong-type"],
)
def test_kubernetes_validate_broken_manifest_rejected(kind: str, change: Any) -> None:
    """The schema check is not vacuous: a misspelt field or a wrong type fails it."""
    obj = json.loads(json.dumps(rendered("defaults").one(kind)))
    change(obj)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_chart_objects_scenario_in_release_namespace_with_labels(scenario: str) -> None:
    for obj in rendered(scenario).objects:
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE, meta["name"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm", meta["name"]
        assert meta["labels"]["app.kubernetes.io/instance"] == "edge", meta["name"]


# --- values schema --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCount": "three"}, "/replicaCount"),
        ({"gossip": {"port": "7946"}}, "/gossip/port"),
        ({"gossip": {"port": 70000}}, "/gossip/port"),
        ({"policy": {"reload": {"enabled": "yes"}}}, "/policy/reload/enabled"),
        ({"policy": {"preset": "fastest"}}, "/policy/preset"),
        ({"service": {"type": "Ingress"}}, "/service/type"),
        ({"router": {"backends": {"static": "http://vllm:8000"}}}, "/router/backends/static"),
        ({"router": {"backends": {"dns": {"scheme": "grpc"}}}}, "/router/backends/dns/scheme"),
        ({"replicas": 3}, "replicas"),
        ({"gossip": {"secret": "x"}}, "secret"),
    ],
    ids=[
        "replica-count-string",
        "gossip-port-string",
        "gossip-port-out-of-range",
        "reload-enabled-string",
        "unknown-preset",
        "unknown-service-type",
        "static-backends-not-a-list",
        "unknown-dns-scheme",
        "unknown-top-level-key",
        "unknown-nested-key",
    ],
)
def test_values_schema_bad_value_rejected_naming_the_key(
    values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)


def test_values_schema_every_chart_object_is_closed() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    open_objects: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node and node.get("additionalProperties") is not False:
            open_objects.append(path or "(top)")
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}")

    walk(schema, "")
    assert open_objects == []


def test_values_schema_defaults_accepted() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema({})
        assert chart.schema is not None


def test_values_file_every_key_has_a_comment_above() -> None:
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    bare = [
        f"line {n + 1}: {line.strip()}"
        for n, line in enumerate(lines)
        if re.match(r"^\s*[A-Za-z_][\w.-]*:", line)
        and not (n > 0 and lines[n - 1].strip().startswith("#"))
    ]
    assert bare == []


def test_chart_metadata_has_kube_version_and_app_version_of_the_package() -> None:
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"]
    assert meta["appVersion"] == project["version"]


# --- values that contradict each other ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"gossip": {"tls": {"enabled": True}}}, r"gossip\.tls\.secretName is required"),
        (
            {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
            r"autoscaling\.minReplicas \(5\) is above autoscaling\.maxReplicas \(2\)",
        ),
        ({"policy": {"inline": "name: [unclosed"}}, r"policy\.inline is not a YAML mapping"),
        ({"policy": {"inline": "just a sentence"}}, r"policy\.inline is not a YAML mapping"),
        (
            {"router": {"drain": {"graceSeconds": 56}}},
            r"drain\.graceSeconds \(56\) \+ 5 is above terminationGracePeriodSeconds \(60\)",
        ),
        (
            {"terminationGracePeriodSeconds": 30},
            r"drain\.graceSeconds \(45\) \+ 5 is above terminationGracePeriodSeconds \(30\)",
        ),
        (
            {"router": {"backends": {"apiKeyFromSecret": True}}},
            r"router\.backends\.apiKeyFromSecret reads engine-api-key from secrets\.existingSecret",
        ),
        (
            {"gossip": {"port": ROUTER_METRICS_PORT}},
            r"gossip\.port \(9090\) must differ from the router's API port \(8000\) and metrics",
        ),
        (
            {"gossip": {"port": ROUTER_HTTP_PORT}},
            r"gossip\.port \(8000\) must differ from the router's API port \(8000\) and metrics",
        ),
    ],
    ids=[
        "tls-without-secret",
        "hpa-min-above-max",
        "inline-bad-yaml",
        "inline-not-a-mapping",
        "drain-grace-past-sigkill",
        "sigkill-before-default-drain",
        "engine-key-from-no-secret",
        "gossip-on-metrics-port",
        "gossip-on-api-port",
    ],
)
def test_render_inconsistent_values_fails_with_reason(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=reason):
        render(values)
