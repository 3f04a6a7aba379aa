"""Gossip in the chart: the headless Service peers find, the secret, the pod's name and IP, TLS."""

from __future__ import annotations

import posixpath

import pytest

from tests.chart.support import (
    CLUSTER_DOMAIN,
    NAMESPACE,
    ROUTER_GOSSIP_PORT,
    ROUTER_POD_ENV,
    SCENARIO_IDS,
    container_port,
    labels_match,
    render,
    rendered,
    values_of,
)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_gossip_dns_scenario_names_the_headless_service(scenario: str) -> None:
    out = rendered(scenario)
    gossip = out.router_config()["gossip"]
    if not gossip["enabled"]:
        assert not [s for s in out.of_kind("Service") if s["spec"].get("clusterIP") == "None"]
        return
    host, _, port = gossip["dns"].rpartition(":")
    service_name, ns, svc, domain = host.split(".", 3)
    assert (ns, svc, domain) == (NAMESPACE, "svc", CLUSTER_DOMAIN)
    service = out.one("Service", service_name)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod_labels = out.router_deployment()["spec"]["template"]["metadata"]["labels"]
    assert labels_match(service["spec"]["selector"], pod_labels)
    (svc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "gossip"]
    assert svc_port["port"] == int(port) == gossip["port"]
    assert container_port(out.router_container(), svc_port["targetPort"]) == gossip["port"]


def test_gossip_port_default_is_the_router_default() -> None:
    assert rendered("defaults").router_config()["gossip"]["port"] == ROUTER_GOSSIP_PORT


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_gossip_secret_scenario_comes_from_the_secret(scenario: str) -> None:
    out = rendered(scenario)
    config = out.router_config()
    env = {e["name"]: e for e in out.router_container()["env"]}
    admin = env[config["admin_token_env"]]["valueFrom"]["secretKeyRef"]
    assert admin["optional"] is True  # no token: admin endpoints off
    existing = values_of(scenario).get("secrets", {}).get("existingSecret")
    if config["gossip"]["enabled"]:
        ref = env[config["gossip"]["secret_env"]]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == admin["name"]
        if existing:
            assert ref["name"] == existing
        else:
            assert ref["key"] in out.one("Secret", ref["name"])["data"]
    if existing:
        assert out.of_kind("Secret") == []


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_gossip_scenario_pod_name_and_ip_from_downward_api(scenario: str) -> None:
    out = rendered(scenario)
    env = {e["name"]: e for e in out.router_container().get("env", [])}
    if not out.router_config()["gossip"]["enabled"]:
        assert not set(ROUTER_POD_ENV) & set(env)
        return
    assert out.router_config()["listen"]["host"] == "0.0.0.0"  # so the pod IP is advertised
    for name, field_path in ROUTER_POD_ENV.items():
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field_path


def test_gossip_tls_enabled_files_mounted_from_secret() -> None:
    out = render({"gossip": {"tls": {"enabled": True, "secretName": "router-tls"}}})
    tls = out.router_config()["gossip"]["tls"]
    for path in tls.values():
        _, volume = out.mount_for_file(path)
        assert volume["secret"]["secretName"] == "router-tls"
    assert {posixpath.basename(p) for p in tls.values()} == {"tls.crt", "tls.key", "ca.crt"}
