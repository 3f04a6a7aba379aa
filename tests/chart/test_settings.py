"""The config file loads with the router's own loader, and every chart setting reaches it.

The chart's defaults are the router's defaults (but the drain), each scenario's values are
what the router loads, fractional values stay numbers, and the drain's grace ends before
the pod is killed.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.chart.support import (
    DRAIN_MARGIN_SECONDS,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS_PORT,
    SCENARIO_IDS,
    merged_values,
    render,
    rendered,
    values_of,
)


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
    if config.engines.static or config.engines.dns:
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
    from router.gateway.config.serving import FlowControl, Forwarding, Limits
    from router.gateway.config.settings import load_config_text

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


MODELS = {
    "aliases": {"fast": "meta-llama/Llama-3.1-8B-Instruct", "small": "fast"},
    "patterns": [{"match": "gpt-4*", "model": "meta-llama/Llama-3.1-70B-Instruct"}],
}


def _annotations(out: Any) -> dict[str, str]:
    meta = out.router_deployment()["spec"]["template"]["metadata"]
    annotations: dict[str, str] = meta["annotations"]
    return annotations


def test_router_models_reach_the_router_and_stay_out_of_the_restart_checksum() -> None:
    from router.gateway.config.settings import load_config_text

    out = render({"router": {"models": MODELS}})
    loaded = load_config_text(out.router_config_text(), "config.yaml").models
    assert loaded.served("small") == "meta-llama/Llama-3.1-8B-Instruct"
    assert loaded.served("gpt-4o") == "meta-llama/Llama-3.1-70B-Instruct"
    defaults = render({})
    assert load_config_text(defaults.router_config_text(), "c.yaml").models.aliases == {}
    # Hot reload on: an alias edit reaches the pods without restarting them.
    assert _annotations(out)["checksum/config"] == _annotations(defaults)["checksum/config"]
    assert "checksum/models" not in _annotations(out)
    off = {"policy": {"reload": {"enabled": False}}}
    assert (
        _annotations(render({**off, "router": {"models": MODELS}}))["checksum/models"]
        != _annotations(render(off))["checksum/models"]
    )


def test_router_backends_kind_reaches_static_and_dns_engines() -> None:
    from router.gateway.config.settings import load_config_text

    backends = {
        "static": ["http://sglang-0.sglang:30000"],
        "dns": {"name": "sglang-headless", "port": 30000, "scheme": "http", "intervalSeconds": 10},
        "kind": "sglang",
    }
    out = render({"router": {"backends": backends}})
    engines = load_config_text(out.router_config_text(), "config.yaml").engines
    assert engines.kind_of("http://sglang-0.sglang:30000") == "sglang"
    assert engines.kind_of("http://10.0.0.7:30000", "dns:sglang-headless") == "sglang"
    plain = load_config_text(render({}).router_config_text(), "config.yaml").engines
    assert plain.static_kinds == {} and plain.kind_of("http://x:1") == "vllm"


@pytest.mark.parametrize(
    ("models", "key"),
    [
        ({"aliases": {"a": ""}}, "aliases"),
        ({"patterns": [{"match": "x"}]}, "patterns"),
        ({"aliases": {}, "patterns": [], "extra": 1}, "extra"),
    ],
    ids=["empty-target", "pattern-without-model", "unknown-key"],
)
def test_router_models_schema_refuses_bad_values(models: dict[str, Any], key: str) -> None:
    with pytest.raises(helm_python.HelmError) as e:
        render({"router": {"models": models}})
    assert key in str(e.value)
