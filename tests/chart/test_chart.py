"""The Helm chart and the Dockerfile, checked offline with Helm's own code and Kubernetes' schemas.

Every scenario (the chart defaults and each ci/*-values.yaml) is rendered, linted strictly and
validated manifest by manifest; then the contracts between the chart and the router are checked
on the rendered objects: the policy file the router watches is the ConfigMap key mounted there,
the gossip DNS name is the headless Service, probes call endpoints the router serves, and the
dashboard queries only metrics the router exports. The Dockerfile cannot be built here (no
container engine), so its properties are checked on its text.
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
import tomllib
from functools import cache
from typing import Any

import helm_python
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.chart.support import (
    CHART_DIR,
    CI_VALUES,
    CLUSTER_DOMAIN,
    CRD_KINDS,
    DOCKERFILE,
    DOCKERIGNORE,
    DRAIN_MARGIN_SECONDS,
    KUBE_VERSIONS,
    NAMESPACE,
    POLICY_PRESETS,
    ROOT,
    ROUTER_CONFIG_KEYS,
    ROUTER_ENGINE_KEY_ENV,
    ROUTER_GOSSIP_PORT,
    ROUTER_HTTP_PATHS,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS,
    ROUTER_METRICS_PORT,
    ROUTER_POD_ENV,
    SERVICE_MONITOR_API,
    Rendered,
    Stage,
    config_arg,
    container_port,
    dashboard_queries,
    dockerignore_excludes,
    labels_match,
    lint_findings,
    merged_values,
    parse_dockerfile,
    promql_metric_names,
    render,
    scenarios,
    series_names,
)

SCENARIOS = scenarios()
SCENARIO_IDS = [name for name, _ in SCENARIOS]


@cache
def rendered(scenario: str) -> Rendered:
    values = dict(SCENARIOS)[scenario]
    return render(values)


def values_of(scenario: str) -> dict[str, Any]:
    return dict(SCENARIOS)[scenario]


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


# --- contract: config file and policy file --------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_router_config_scenario_has_the_contract_keys(scenario: str) -> None:
    config = rendered(scenario).router_config()
    assert set(config) == ROUTER_CONFIG_KEYS
    assert config["listen"] == {
        "host": "0.0.0.0",
        "port": ROUTER_HTTP_PORT,
        "metrics_port": ROUTER_METRICS_PORT,
    }
    assert config["admin_token_env"] == "KVROUTER_ADMIN_TOKEN"
    assert config["gossip"]["secret_env"] == "KVROUTER_GOSSIP_SECRET"


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_policy_path_scenario_is_the_configmap_key_mounted_there(scenario: str) -> None:
    out = rendered(scenario)
    policy_path = out.router_config()["policy"]
    mount, volume = out.mount_for_file(policy_path)
    # subPath mounts never see ConfigMap updates: the policy must come through a directory.
    assert "subPath" not in mount
    assert "configMap" in volume
    cm = out.configmap_for_file(policy_path)
    key = out.key_for_file(policy_path)
    policy = yaml.safe_load(cm["data"][key])
    assert policy["version"] == 1 and policy["name"]


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_config_arg_scenario_is_a_mounted_configmap_key(scenario: str) -> None:
    out = rendered(scenario)
    path = config_arg(out.router_container())
    assert path == "/etc/kvrouter/config/config.yaml"
    mount, _ = out.mount_for_file(path)
    assert "subPath" not in mount
    assert out.key_for_file(path) in out.configmap_for_file(path)["data"]


@pytest.mark.parametrize(
    ("values", "expected_name"),
    [
        ({}, "kv-aware"),
        ({"policy": {"preset": "round-robin"}}, "round-robin"),
        ({"policy": {"preset": "least-load"}}, "least-load"),
        ({"policy": {"preset": "consistent-hash"}}, "consistent-hash"),
        ({"policy": {"inline": "version: 1\nname: mine\npicker: round-robin\n"}}, "mine"),
        (
            {"policy": {"preset": "least-load", "inline": "version: 1\nname: mine\n"}},
            "mine",
        ),
    ],
    ids=["default", "round-robin", "least-load", "consistent-hash", "inline", "inline-over-preset"],
)
def test_policy_values_choice_is_what_the_router_reads(
    values: dict[str, Any], expected_name: str
) -> None:
    out = render(values)
    path = out.router_config()["policy"]
    policy = yaml.safe_load(out.configmap_for_file(path)["data"][out.key_for_file(path)])
    assert policy["name"] == expected_name


@pytest.mark.parametrize("preset", POLICY_PRESETS)
def test_chart_preset_valid_for_the_router_policy_loader(preset: str) -> None:
    from router.policy_file import load_policy

    policy = load_policy(CHART_DIR / "policies" / f"{preset}.yaml")
    assert policy.name == preset


def test_chart_presets_schema_enum_matches_shipped_files() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    enum = set(schema["properties"]["policy"]["properties"]["preset"]["enum"])
    shipped = {p.stem for p in (CHART_DIR / "policies").glob("*.yaml")}
    assert enum == shipped == set(POLICY_PRESETS)


@pytest.mark.parametrize(
    ("reload_enabled", "has_policy_checksum"),
    [(True, False), (False, True)],
    ids=["hot-reload-on", "hot-reload-off"],
)
def test_policy_checksum_annotation_reload_setting_only_when_off(
    reload_enabled: bool, has_policy_checksum: bool
) -> None:
    values = {"policy": {"reload": {"enabled": reload_enabled}}}
    out = render(values)
    annotations = out.router_deployment()["spec"]["template"]["metadata"]["annotations"]
    assert ("checksum/policy" in annotations) is has_policy_checksum
    assert out.router_config()["policy_reload"]["enabled"] is reload_enabled


@pytest.mark.parametrize(
    ("reload_enabled", "restarts"),
    [(True, False), (False, True)],
    ids=["hot-reload-on", "hot-reload-off"],
)
def test_policy_change_pod_template_changes_only_without_hot_reload(
    reload_enabled: bool, restarts: bool
) -> None:
    def template(preset: str) -> dict[str, Any]:
        values = {"policy": {"preset": preset, "reload": {"enabled": reload_enabled}}}
        spec: dict[str, Any] = render(values).router_deployment()["spec"]["template"]
        return spec

    assert (template("kv-aware") != template("least-load")) is restarts


def test_config_change_pod_template_changes_to_restart() -> None:
    """config.yaml is read once at start, so changing it must roll the pods."""

    def annotations(seconds: int) -> dict[str, str]:
        out = render({"router": {"timeouts": {"firstByteSeconds": seconds}}})
        return dict(out.router_deployment()["spec"]["template"]["metadata"]["annotations"])

    assert annotations(300)["checksum/config"] != annotations(600)["checksum/config"]


# --- contract: KV events -------------------------------------------------------------------


def kv_events_values(**kv: Any) -> dict[str, Any]:
    return {"router": {"backends": {"kvEvents": kv}}}


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_kv_events_scenario_without_port_absent_from_config(scenario: str) -> None:
    """Port 0 (the default) is off: the file says nothing and the router keeps text keys."""
    from router.gateway.config.settings import parse_config

    config = rendered(scenario).router_config()
    assert "kv_events" not in config["backends"]
    assert not parse_config(config).engines.kv_events.enabled


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"port": 5557, "replayPort": 5558, "topic": "kv@"},
            {"port": 5557, "replay_port": 5558, "topic": "kv@"},
        ),
        ({"port": 5557}, {"port": 5557, "replay_port": 0, "topic": ""}),
    ],
    ids=["port-replay-topic", "port-only"],
)
def test_kv_events_port_set_config_has_the_port_rule(
    values: dict[str, Any], expected: dict[str, Any]
) -> None:
    from router.gateway.config.settings import parse_config

    config = render(kv_events_values(**values)).router_config()
    assert config["backends"]["kv_events"] == expected
    # The router's own strict loader reads it as the port rule for every engine's host.
    kv = parse_config(config, "config.yaml").engines.kv_events
    assert (kv.port, kv.replay_port, kv.topic) == (
        expected["port"],
        expected["replay_port"],
        expected["topic"],
    )
    assert kv.enabled and dict(kv.endpoints) == {}


def test_kv_events_change_pod_template_changes_to_restart() -> None:
    """config.yaml is read once at start: setting or changing the port rolls the pods."""

    def checksum(values: dict[str, Any]) -> str:
        template = render(values).router_deployment()["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/config"])

    off = checksum({})
    assert checksum(kv_events_values(port=0)) == off
    assert (
        len({off, checksum(kv_events_values(port=5557)), checksum(kv_events_values(port=5559))})
        == 3
    )


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (kv_events_values(port=70000), "/router/backends/kvEvents/port"),
        (kv_events_values(port=-1), "/router/backends/kvEvents/port"),
        (kv_events_values(replayPort="5558"), "/router/backends/kvEvents/replayPort"),
        (kv_events_values(topic=7), "/router/backends/kvEvents/topic"),
        (kv_events_values(endpoint="tcp://vllm:5557"), "endpoint"),
    ],
    ids=["port-out-of-range", "port-negative", "replay-port-string", "topic-number", "unknown"],
)
def test_kv_events_schema_bad_value_rejected_naming_the_key(
    values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)


@pytest.mark.parametrize(
    "values",
    [
        {"replayPort": 5558},
        {"topic": "kv"},
        {"tokenizer": {"volume": {"emptyDir": {}}, "path": ""}},
    ],
    ids=["replay-port-without-port", "topic-without-port", "tokenizer-without-port"],
)
def test_kv_events_settings_without_port_fail_with_reason(values: dict[str, Any]) -> None:
    """A replay port or topic with events off would be silently ignored: refuse it instead."""
    with pytest.raises(helm_python.HelmRenderError, match=r"kvEvents\.port is required"):
        render(kv_events_values(**values))


def test_kv_events_tokenizer_volume_is_mounted_where_the_config_reads_it() -> None:
    from router.gateway.config.settings import parse_config

    claim = {"persistentVolumeClaim": {"claimName": "model-weights", "readOnly": True}}
    tokenizer = {"volume": claim, "path": "llama-3.1-8b/"}
    out = render(kv_events_values(port=5557, tokenizer=tokenizer))
    path = parse_config(out.router_config()).engines.kv_events.tokenizer
    assert path == "/etc/kvrouter/tokenizer/llama-3.1-8b"
    mount, volume = out.mount_for_file(path + "/tokenizer.json")
    assert mount["readOnly"] is True
    assert volume == {"name": "tokenizer", **claim}
    # Without a volume the engines tokenize: no mount, and the config says nothing.
    plain = render(kv_events_values(port=5557))
    assert "tokenizer" not in plain.router_config()["backends"]["kv_events"]
    with pytest.raises(AssertionError, match="on no volume mount"):
        plain.mount_for_file("/etc/kvrouter/tokenizer/tokenizer.json")


@pytest.mark.parametrize(
    ("tokenizer", "error", "reason"),
    [
        ({"volume": {"emptyDir": {}}, "path": "/abs"}, helm_python.HelmValuesError, "path"),
        ({"volume": {"emptyDir": {}}, "path": "a/../.."}, helm_python.HelmRenderError, r"\.\."),
        ({"volume": {"emptyDir": {}}, "path": "", "x": 1}, helm_python.HelmValuesError, "x"),
    ],
    ids=["absolute-path", "dot-dot", "unknown-key"],
)
def test_kv_events_tokenizer_bad_values_fail_with_reason(
    tokenizer: dict[str, Any], error: type[Exception], reason: str
) -> None:
    with pytest.raises(error, match=reason):
        render(kv_events_values(port=5557, tokenizer=tokenizer))


def test_kv_events_network_policy_leaves_egress_to_the_engines_open() -> None:
    """The router subscribes to the engines' event ports: no egress rule may shut them out."""
    out = render(kv_events_values(port=5557, replayPort=5558))
    (policy,) = out.of_kind("NetworkPolicy")
    assert "Egress" not in policy["spec"]["policyTypes"]
    assert "egress" not in policy["spec"]


# --- contract: the config file loads, and every setting reaches the router -------------------


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_router_config_scenario_loads_with_the_router_loader(scenario: str) -> None:
    """The router refuses an unknown key or a wrong type at start: its own loader must agree."""
    from router.gateway.config.settings import check_ready_to_serve, load_config_text

    out = rendered(scenario)
    config = load_config_text(out.router_config_text(), "config.yaml")
    assert (config.listen.port, config.listen.metrics_port) == (
        ROUTER_HTTP_PORT,
        ROUTER_METRICS_PORT,
    )
    if config.engines.static or config.engines.dns is not None:
        check_ready_to_serve(config)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_router_settings_scenario_values_are_what_the_router_loads(scenario: str) -> None:
    from router.gateway.config.settings import load_config_text

    router = merged_values(values_of(scenario))["router"]
    config = load_config_text(rendered(scenario).router_config_text(), "config.yaml")
    limits, flow, forwarding = router["limits"], router["flowControl"], router["forwarding"]
    assert (
        config.limits.max_connections,
        config.limits.header_timeout_seconds,
        config.limits.keepalive_timeout_seconds,
        config.limits.retry_budget_percent,
    ) == (
        limits["maxConnections"],
        limits["headerTimeoutSeconds"],
        limits["keepaliveTimeoutSeconds"],
        limits["retryBudgetPercent"],
    )
    assert (
        config.flow_control.enabled,
        config.flow_control.max_queue,
        config.flow_control.max_wait_seconds,
        config.flow_control.max_inflight_per_engine,
        config.flow_control.priority_reserve,
        config.flow_control.tenant_header,
        config.flow_control.priority_header,
    ) == (
        flow["enabled"],
        flow["maxQueue"],
        flow["maxWaitSeconds"],
        flow["maxInflightPerEngine"],
        flow["priorityReserve"],
        flow["tenantHeader"],
        flow["priorityHeader"],
    )
    assert (
        config.forwarding.client_credentials,
        config.forwarding.trust_forwarding_headers,
    ) == (forwarding["clientCredentials"], forwarding["trustForwardingHeaders"])
    assert config.drain.grace_seconds == router["drain"]["graceSeconds"]


def test_router_settings_defaults_are_the_router_defaults() -> None:
    """Installing the chart changes nothing the router would do on its own (but the drain)."""
    from router.gateway.config.settings import FlowControl, Forwarding, Limits, load_config_text

    router = merged_values({})["router"]
    limits, flow, forwarding = Limits(), FlowControl(), Forwarding()
    assert router["limits"] == {
        "maxBodyBytes": limits.max_body_bytes,
        "maxAttempts": limits.max_attempts,
        "retryBudgetPercent": limits.retry_budget_percent,
        "maxConnections": limits.max_connections,
        "headerTimeoutSeconds": limits.header_timeout_seconds,
        "keepaliveTimeoutSeconds": limits.keepalive_timeout_seconds,
    }
    assert router["flowControl"] == {
        "enabled": flow.enabled,
        "maxQueue": flow.max_queue,
        "maxWaitSeconds": flow.max_wait_seconds,
        "maxInflightPerEngine": flow.max_inflight_per_engine,
        "priorityReserve": flow.priority_reserve,
        "tenantHeader": flow.tenant_header,
        "priorityHeader": flow.priority_header,
    }
    assert router["forwarding"] == {
        "clientCredentials": forwarding.client_credentials,
        "trustForwardingHeaders": forwarding.trust_forwarding_headers,
    }
    config = load_config_text(rendered("defaults").router_config_text(), "config.yaml")
    assert (config.limits, config.flow_control, config.forwarding) == (limits, flow, forwarding)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_drain_scenario_cut_comes_before_sigkill(scenario: str) -> None:
    out = rendered(scenario)
    grace = out.router_config()["drain"]["grace_seconds"]
    kill_after = out.router_deployment()["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace > 0 and grace + DRAIN_MARGIN_SECONDS <= kill_after


@pytest.mark.parametrize(
    ("grace", "kill_after"),
    [(45, 50), (55, 60), (0, 5), (2.5, 8)],
    ids=["default-grace-tight", "at-the-limit", "no-grace", "fractional"],
)
def test_drain_grace_within_termination_period_rendered(grace: float, kill_after: int) -> None:
    out = render(
        {"router": {"drain": {"graceSeconds": grace}}, "terminationGracePeriodSeconds": kill_after}
    )
    assert out.router_config()["drain"] == {"grace_seconds": grace}
    pod = out.router_deployment()["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == kill_after


def test_router_settings_fractional_values_render_as_numbers() -> None:
    """Seconds and percentages may be fractional: neither cut to an int nor quoted."""
    from router.gateway.config.settings import load_config_text

    out = render(
        {
            "router": {
                "limits": {
                    "retryBudgetPercent": 12.5,
                    "headerTimeoutSeconds": 0.5,
                    "keepaliveTimeoutSeconds": 75.25,
                },
                "flowControl": {"maxWaitSeconds": 0.25},
                "drain": {"graceSeconds": 7.5},
            }
        }
    )
    config = out.router_config()
    assert config["limits"]["retry_budget_percent"] == 12.5
    assert config["limits"]["header_timeout_seconds"] == 0.5
    assert config["limits"]["keepalive_timeout_seconds"] == 75.25
    assert config["flow_control"]["max_wait_seconds"] == 0.25
    assert config["drain"]["grace_seconds"] == 7.5
    # Large integers stay integers, never 1.6777216e+07 or a string.
    assert config["limits"]["max_body_bytes"] == 16777216
    assert type(config["limits"]["max_connections"]) is int
    loaded = load_config_text(out.router_config_text(), "config.yaml")
    assert loaded.limits.retry_budget_percent == 12.5
    assert loaded.drain.grace_seconds == 7.5


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"router": {"limits": {"retryBudgetPercent": 101}}}, "/router/limits/retryBudgetPercent"),
        ({"router": {"limits": {"maxConnections": 0}}}, "/router/limits/maxConnections"),
        ({"router": {"limits": {"maxConnections": 2.5}}}, "/router/limits/maxConnections"),
        (
            {"router": {"limits": {"headerTimeoutSeconds": 0}}},
            "/router/limits/headerTimeoutSeconds",
        ),
        (
            {"router": {"limits": {"keepaliveTimeoutSeconds": "75"}}},
            "/router/limits/keepaliveTimeoutSeconds",
        ),
        ({"router": {"flowControl": {"maxQueue": -1}}}, "/router/flowControl/maxQueue"),
        ({"router": {"flowControl": {"enabled": "yes"}}}, "/router/flowControl/enabled"),
        (
            {"router": {"flowControl": {"tenantHeader": "x tenant"}}},
            "/router/flowControl/tenantHeader",
        ),
        ({"router": {"flowControl": {"priorityHeader": ""}}}, "/router/flowControl/priorityHeader"),
        ({"router": {"flowControl": {"retryAfterSeconds": 2}}}, "retryAfterSeconds"),
        (
            {"router": {"forwarding": {"trustForwardingHeaders": 1}}},
            "/router/forwarding/trustForwardingHeaders",
        ),
        ({"router": {"drain": {"graceSeconds": -1}}}, "/router/drain/graceSeconds"),
        ({"router": {"drain": {"graceSeconds": "45"}}}, "/router/drain/graceSeconds"),
        (
            {"router": {"backends": {"apiKeyFromSecret": "true"}}},
            "/router/backends/apiKeyFromSecret",
        ),
        ({"secrets": {"engineApiKey": 12345}}, "/secrets/engineApiKey"),
        ({"networkPolicy": {"metricsFrom": {"podSelector": {}}}}, "/networkPolicy/metricsFrom"),
    ],
    ids=[
        "retry-budget-above-100",
        "max-connections-zero",
        "max-connections-fractional",
        "header-timeout-zero",
        "keepalive-string",
        "max-queue-negative",
        "flow-enabled-string",
        "tenant-header-not-a-token",
        "priority-header-empty",
        "flow-unknown-key",
        "trust-forwarding-number",
        "drain-negative",
        "drain-string",
        "api-key-from-secret-string",
        "engine-key-number",
        "metrics-from-not-a-list",
    ],
)
def test_router_settings_schema_bad_value_rejected_naming_the_key(
    values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)


# --- contract: the engines' API key ---------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "secret"),
    [
        ({}, None),
        ({"secrets": {"existingSecret": "mine"}}, None),
        ({"secrets": {"engineApiKey": "sk-engine"}}, "edge-kvrouter"),
        (
            {
                "secrets": {"existingSecret": "mine"},
                "router": {"backends": {"apiKeyFromSecret": True}},
            },
            "mine",
        ),
        (
            {
                "secrets": {"engineApiKey": "sk-engine"},
                "router": {"backends": {"apiKeyFromSecret": True}},
            },
            "edge-kvrouter",
        ),
    ],
    ids=["none", "existing-secret-without-key", "chart-secret", "existing-secret", "both"],
)
def test_engine_api_key_values_env_named_in_config_from_the_secret(
    values: dict[str, Any], secret: str | None
) -> None:
    from router.gateway.config.settings import load_config_text

    out = render(values)
    env = {e["name"]: e for e in out.router_container()["env"]}
    loaded = load_config_text(out.router_config_text(), "config.yaml")
    if secret is None:
        assert "api_key_env" not in out.router_config()["backends"]
        assert loaded.engines.api_key_env == ""
        assert ROUTER_ENGINE_KEY_ENV not in env
        for s in out.of_kind("Secret"):
            assert "engine-api-key" not in s["data"]
        return
    assert loaded.engines.api_key_env == ROUTER_ENGINE_KEY_ENV
    ref = env[ROUTER_ENGINE_KEY_ENV]["valueFrom"]["secretKeyRef"]
    # Not optional: without the key the pod must not start (the router would refuse anyway).
    assert ref == {"name": secret, "key": "engine-api-key"}
    if secret == "edge-kvrouter":
        data = out.one("Secret", secret)["data"]
        assert base64.b64decode(data["engine-api-key"]).decode() == "sk-engine"
    else:
        assert out.of_kind("Secret") == []


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_engine_api_key_scenario_env_exists_when_config_names_it(scenario: str) -> None:
    out = rendered(scenario)
    name = out.router_config()["backends"].get("api_key_env")
    env = {e["name"]: e for e in out.router_container()["env"]}
    if name is None:
        assert ROUTER_ENGINE_KEY_ENV not in env
        return
    ref = env[name]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == "engine-api-key" and not ref.get("optional", False)
    existing = values_of(scenario).get("secrets", {}).get("existingSecret")
    if existing:
        assert ref["name"] == existing
    else:
        assert ref["key"] in out.one("Secret", ref["name"])["data"]


def test_engine_api_key_change_pod_template_changes_to_restart() -> None:
    """The key reaches the router through its environment, read at start: a new key rolls."""

    def annotations(key: str) -> dict[str, str]:
        out = render({"secrets": {"engineApiKey": key}})
        return dict(out.router_deployment()["spec"]["template"]["metadata"]["annotations"])

    assert annotations("one")["checksum/secret"] != annotations("two")["checksum/secret"]


# --- contract: gossip -----------------------------------------------------------------------


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


# --- contract: HTTP, probes, Services -------------------------------------------------------


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


# --- Deployment shape -----------------------------------------------------------------------


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


# --- Grafana dashboard ----------------------------------------------------------------------


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


# --- Dockerfile -----------------------------------------------------------------------------

BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|build-essential|cmake|cargo|rustc|[\w.+-]+-dev|"
    r"grpcio-tools|grpc_tools|apt-get\s+install|apk\s+add|pip\s+install)\b"
)


@cache
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def dockerfile_uid() -> int:
    user = stages()[-1].last("USER")
    assert user is not None, "the final stage sets no USER"
    return int(user.args.split(":")[0])


def test_dockerfile_stages_builder_and_slim_final() -> None:
    assert len(stages()) >= 2
    assert stages()[0].name == "builder"
    assert stages()[-1].base == "python:3.11-slim"


def test_dockerfile_final_stage_user_non_root() -> None:
    user = stages()[-1].last("USER")
    assert user is not None
    assert user.args.split(":")[0] not in {"root", "0"}
    assert dockerfile_uid() == 10001


def test_dockerfile_entrypoint_runs_kvrouter_serve() -> None:
    final = stages()[-1]
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None and cmd is not None
    assert entrypoint.exec_form() == ["kvrouter"]
    assert cmd.exec_form()[0] == "serve"


def test_dockerfile_final_stage_installs_no_build_tools() -> None:
    final = stages()[-1]
    offending = [run for run in final.runs() if BUILD_TOOLS.search(run)]
    assert offending == []
    copies = [i.args for i in final.instructions if i.keyword in {"COPY", "ADD"}]
    assert copies and all(c.startswith("--from=builder ") for c in copies), copies


def test_dockerfile_builder_installs_the_wheel_it_builds_and_generates_nothing() -> None:
    # The image installs what a user installs: kvrouter's wheel, with the presets and the
    # committed gossip code inside; no protobuf compiler and no code generation.
    builder = stages()[0]
    runs = builder.runs()
    wheel = next(i for i, r in enumerate(runs) if re.search(r"pip wheel --no-deps", r))
    install = next(
        i for i, r in enumerate(runs) if re.search(r"/opt/kvrouter/bin/pip install .*\.whl", r)
    )
    assert wheel <= install
    assert not [r for r in runs if re.search(r"protogen|protoc|grpc_tools|grpcio-tools", r)]
    copied = " ".join(i.args for i in builder.instructions if i.keyword == "COPY")
    assert "policies/" in copied and "router/" in copied


def test_dockerfile_final_stage_gets_the_builder_venv_on_path() -> None:
    final = stages()[-1]
    assert any(
        i.keyword == "COPY" and i.args.split()[1:] == ["/opt/kvrouter", "/opt/kvrouter"]
        for i in final.instructions
    )
    env = " ".join(i.args for i in final.instructions if i.keyword == "ENV")
    assert "PATH=/opt/kvrouter/bin:" in env


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("policies/kv-aware.yaml", False),
        ("proto/gossip.proto", True),
        ("router/cli.py", False),
        ("router/core/policy.py", False),
        (".venv/bin/python", True),
        (".git/HEAD", True),
        ("tests/test_chart.py", True),
        ("helm/kvrouter/values.yaml", True),
        ("router/__pycache__/cli.cpython-311.pyc", True),
        ("router/gossip/pb/gossip_pb2.py", False),
    ],
)
def test_dockerignore_path_in_context_as_expected(path: str, excluded: bool) -> None:
    patterns = DOCKERIGNORE.read_text().splitlines()
    assert dockerignore_excludes(patterns, path) is excluded


def test_dockerignore_keeps_every_copied_source() -> None:
    patterns = DOCKERIGNORE.read_text().splitlines()
    for stage in stages():
        for copy in (i for i in stage.instructions if i.keyword == "COPY"):
            words = copy.args.split()
            if words[0].startswith("--from="):
                continue
            for src in words[:-1]:
                assert not dockerignore_excludes(patterns, src.rstrip("/")), src
