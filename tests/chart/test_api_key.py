"""The engines' API key: named in the config file, read from a Secret, rolled when changed."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.chart.support import (
    ROUTER_ENGINE_KEY_ENV,
    SCENARIO_IDS,
    render,
    rendered,
    values_of,
)


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
