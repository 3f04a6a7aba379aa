"""The config file and the policy file: what the router reads is what the chart mounts.

The policy file the router watches is a ConfigMap key mounted through a directory (so hot
reload sees updates), each preset the chart ships loads with the router's own loader, and
the pod template changes (the pods roll) only when the router could not pick a change up.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from router import presets
from tests.chart.support import (
    CHART_DIR,
    POLICY_PRESETS,
    ROUTER_CONFIG_KEYS,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS_PORT,
    ROUTER_OPTIONAL_CONFIG_KEYS,
    SCENARIO_IDS,
    config_arg,
    render,
    rendered,
)


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_router_config_scenario_has_the_contract_keys(scenario: str) -> None:
    config = rendered(scenario).router_config()
    assert set(config) - ROUTER_OPTIONAL_CONFIG_KEYS == ROUTER_CONFIG_KEYS
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


# The chart's default is the router's, and every other preset is one value away.
PRESET_CHOICES: list[tuple[dict[str, Any], str]] = [({}, presets.DEFAULT)] + [
    ({"policy": {"preset": name}}, name) for name in POLICY_PRESETS if name != presets.DEFAULT
]
INLINE = "version: 1\nname: mine\n"


@pytest.mark.parametrize(
    ("values", "expected_name"),
    [
        *PRESET_CHOICES,
        ({"policy": {"inline": INLINE + "picker: round-robin\n"}}, "mine"),
        ({"policy": {"preset": POLICY_PRESETS[0], "inline": INLINE}}, "mine"),
    ],
    ids=["default", *(name for _, name in PRESET_CHOICES[1:]), "inline", "inline-over-preset"],
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
    from router.yaml_files import load_policy

    policy = load_policy(CHART_DIR / "policies" / f"{preset}.yaml")
    assert policy.name == preset


def test_chart_presets_schema_enum_is_the_router_presets() -> None:
    """values.schema.json lists the preset names again (Helm reads no Python): keep them equal."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    enum = schema["properties"]["policy"]["properties"]["preset"]["enum"]
    assert sorted(enum) == sorted(presets.NAMES)
    assert len(enum) == len(set(enum))


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
