"""Policy and config files read from disk: bounded, and every failure names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.core.fields import MAX_YAML_BYTES, ConfigError
from router.core.policy import PolicyError
from router.presets import preset_path
from router.yaml_files import load_policy, read_text


def test_yaml_files_preset_loads() -> None:
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
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_text(p, ConfigError)


def test_yaml_file_missing_names_the_file_and_why(tmp_path: Path) -> None:
    p = tmp_path / "absent.yaml"
    with pytest.raises(PolicyError, match=rf"^{p}: cannot read: "):
        load_policy(p)
