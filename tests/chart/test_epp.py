"""The chart's ``mode: epp``: the picker's port on the pods and the Service, the router's
config, RBAC for the pool's pods, an InferencePool pointing at the picker and an example
HTTPRoute, each validated against the extension's and Gateway API's published CRD schemas
(tests/chart/crds, with their sources). ``mode: proxy`` renders none of it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from router.gateway.config.settings import load_config_text
from tests.chart.support import (
    CRD_KINDS,
    KUBE_VERSIONS,
    NAMESPACE,
    lint_findings,
    render,
    rendered,
)

CRDS = Path(__file__).resolve().parent / "crds"
EPP: dict[str, Any] = {
    "mode": "epp",
    "epp": {"inferencePool": {"matchLabels": {"app": "vllm", "tier": "gpu"}}},
}
# Two gossiping pickers behind a network policy: every object the mode can add.
EPP_FULL: dict[str, Any] = {
    **EPP,
    "gossip": {"enabled": True},
    "secrets": {"gossipSecret": "a-test-secret-of-enough-length"},
    "networkPolicy": {"enabled": True},
}


@cache
def crd_schema(kind: str, version: str) -> dict[str, Any]:
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for v in crd["spec"]["versions"]:
            if v["name"] == version:
                schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
                return schema
    raise AssertionError(f"no vendored CRD for {kind} {version}")


def validate(obj: dict[str, Any]) -> None:
    """``obj`` against its CRD's schema (structure, types, enums, patterns; not CEL rules)."""
    version = obj["apiVersion"].rpartition("/")[2]
    jsonschema.validate(obj, crd_schema(obj["kind"], version))


def test_epp_renders_pool_route_rbac_and_the_pickers_port() -> None:
    out = render(EPP)
    pool = out.one("InferencePool")
    route = out.one("HTTPRoute")
    for obj in (pool, route):
        validate(obj)
        assert obj["metadata"]["namespace"] == NAMESPACE
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    service = out.one("Service", "edge-kvrouter")
    port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc-epp")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"] and ref["port"]["number"] == port["port"]
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "vllm", "tier": "gpu"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["kind"], backend["name"]) == ("InferencePool", pool["metadata"]["name"])
    container = out.router_container()
    assert {"name": "grpc-epp", "containerPort": 9002, "protocol": "TCP"} in container["ports"]
    pod = out.router_deployment()["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # the picker reads the pool's pods
    role = out.one("Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = out.one("RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_epp_config_is_the_pickers() -> None:
    config = render(EPP).router_config()
    assert config["epp"] == {"port": 9002, "proxy": False}
    assert config["backends"]["pods"] == {
        "selector": "app=vllm,tier=gpu",
        "namespace": NAMESPACE,
        "port": 8000,
    }


def test_epp_config_loads_in_the_router() -> None:
    cfg = load_config_text(render(EPP).router_config_text(), "config.yaml")
    assert cfg.epp.port == 9002 and not cfg.epp.proxy
    assert cfg.engines.pods is not None and cfg.engines.pods.labels() == {
        "app": "vllm",
        "tier": "gpu",
    }


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_epp_objects_valid_against_kubernetes_and_crd_schemas(kube_version: str) -> None:
    out = render(EPP_FULL)
    for obj in out.objects:
        if obj["kind"] in ("InferencePool", "HTTPRoute"):
            validate(obj)
        elif obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, kube_version, strict=True)
    policy = out.one("NetworkPolicy")
    assert {"port": "grpc-epp", "protocol": "TCP"} in [
        p for rule in policy["spec"]["ingress"] for p in rule["ports"]
    ]


def test_epp_lints_clean_and_the_route_is_optional() -> None:
    assert lint_findings(EPP) == [] and lint_findings(EPP_FULL) == []
    values = {**EPP, "epp": {**EPP["epp"], "httpRoute": {"enabled": False}}}
    out = render(values)
    assert out.of_kind("HTTPRoute") == [] and len(out.of_kind("InferencePool")) == 1


def test_proxy_mode_renders_nothing_of_the_picker() -> None:
    out = rendered("defaults")
    assert not out.of_kind("InferencePool") and not out.of_kind("HTTPRoute")
    assert not out.of_kind("Role")
    assert "epp" not in out.router_config()
    assert all(
        p["name"] != "grpc-epp" for p in out.one("Service", "edge-kvrouter")["spec"]["ports"]
    )


def test_crd_validation_is_not_vacuous() -> None:
    pool = render(EPP).one("InferencePool")
    broken = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 0}]}}
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    broken = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {"port": {"number": 9002}}}}
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        validate(broken)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"mode": "epp"}, "epp.inferencePool.matchLabels is required"),
        ({**EPP, "epp": {**EPP["epp"], "port": 8000}}, "epp.port (8000) must differ"),
    ],
    ids=["no-selector", "port-clash"],
)
def test_epp_inconsistent_values_fail_with_reason(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(Exception, match=re.escape(reason)):
        render(values)


def test_epp_mode_outside_the_enum_is_refused() -> None:
    with pytest.raises(Exception, match="mode"):
        render({"mode": "sidecar"})
