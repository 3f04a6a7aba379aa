"""Policy and config files read from disk: bounded, and every failure names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.core.fields import MAX_YAML_BYTES, ConfigError
from router.core.policy import PolicyError
from router.policy_file import load_policy, read_yaml_file
from router.presets import preset_path


def test_policy_file_preset_loads() -> None:
    assert load_policy(preset_path("kv-aware")).name == "kv-aware"


def test_yaml_file_over_size_limit_refused(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("name: x\nscorers: [{type: load, weight: 1}]\n#" + "x" * MAX_YAML_BYTES)
    with pytest.raises(PolicyError) as e:
        load_policy(p)
    assert str(e.value).startswith(f"{p}: ") and "limit" in str(e.value)


def test_yaml_file_not_utf8_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_bytes(b"a: \xff\xfe")
    with pytest.raises(ConfigError, match="cannot read"):
        read_yaml_file(p, ConfigError)
