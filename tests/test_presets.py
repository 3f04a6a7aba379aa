"""The presets as files, and the one way tools rewrite a setting of one."""

from __future__ import annotations

import pytest

from router.core.policy import load_policy_text
from router.presets import NAMES, preset_path, preset_text


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
