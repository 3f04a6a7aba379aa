"""The presets as files, the chart's copy of them, and the one way tools rewrite a setting.

The Helm chart cannot read files outside its folder, so helm/kvrouter/policies/ holds a copy of
policies/; the copy must stay the same bytes, name for name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from router.core.policy import load_policy_text
from router.presets import NAMES, preset_dir, preset_path, preset_text

ROOT = Path(__file__).resolve().parent.parent
CHART_POLICIES = ROOT / "helm" / "kvrouter" / "policies"


def test_preset_text_sets_nested_and_top_level_values_keeping_the_rest() -> None:
    text = preset_text("kv-aware", {"index.engine_capacity_tokens": 123456, "cold_prefix": "ring"})
    policy = load_policy_text(text, "kv-aware")
    assert policy.cold_prefix == "ring"
    assert policy.index.engine_capacity_tokens == 123456
    original = preset_path("kv-aware").read_text().splitlines()
    assert len(text.splitlines()) == len(original)  # comments and layout kept


@pytest.mark.parametrize("path", ["index.no_such_field", "no_such_section.x", "nothing"])
def test_preset_text_unknown_setting_fails_loudly(path: str) -> None:
    with pytest.raises(KeyError):
        preset_text("kv-aware", {path: 1})


@pytest.mark.parametrize("name", NAMES)
def test_preset_text_without_settings_is_the_file(name: str) -> None:
    assert preset_text(name, {}) == preset_path(name).read_text()


def test_presets_shipped_are_the_names_the_router_knows() -> None:
    assert sorted(p.stem for p in preset_dir().glob("*.yaml")) == sorted(NAMES)


def test_chart_presets_same_names_as_policies_folder() -> None:
    chart = sorted(p.name for p in CHART_POLICIES.glob("*.yaml"))
    assert chart == sorted(p.name for p in (ROOT / "policies").glob("*.yaml"))


@pytest.mark.parametrize("name", NAMES)
def test_chart_preset_byte_identical_to_policies_file(name: str) -> None:
    chart = (CHART_POLICIES / f"{name}.yaml").read_bytes()
    assert chart == (ROOT / "policies" / f"{name}.yaml").read_bytes(), (
        f"helm/kvrouter/policies/{name}.yaml differs from policies/{name}.yaml: copy it over"
    )
