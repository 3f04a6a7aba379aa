"""Policy files: presets load, and every mistake is reported with file, field and reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.core.policy import Policy, PolicyError, load_policy_text
from router.core.scorers import load, session_affinity, ttft_estimate
from router.core.scorers.registry import SCORER_TYPES
from router.presets import NAMES, preset_path
from router.yaml_files import load_policy
from tests.support import ROOT


@pytest.mark.parametrize("name", NAMES)
def test_policy_preset_loads_with_its_name(name: str) -> None:
    assert load_policy(preset_path(name)).name == name


def test_policy_presets_are_all_files_in_policies_dir() -> None:
    assert sorted(p.stem for p in (ROOT / "policies").glob("*.yaml")) == sorted(NAMES)


def test_policy_scorer_params_are_read_by_their_type() -> None:
    p = load_policy_text(
        "name: x\nscorers: [{type: load, weight: 1, metric: tokens},"
        " {type: ttft-estimate, weight: 1, kv_pressure: 1},"
        " {type: session-affinity, weight: 1, header: X-S}]",
        "x",
    )
    assert [s.params for s in p.scorers] == [
        load.Params("tokens"),
        ttft_estimate.Params(kv_pressure=1.0),
        session_affinity.Params(header="x-s"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "name: x\nbogus: 1\nscorers: [{type: load, weight: 1}]",
            "bogus: unknown field",
            id="unknown-top-field",
        ),
        pytest.param("scorers: [{type: load, weight: 1}]", "name: is required", id="missing-name"),
        pytest.param(
            "name: x\nscorers: [{type: load, weight: high}]",
            "scorers[0].weight: must be a number",
            id="weight-not-number",
        ),
        pytest.param(
            "name: x\nscorers: [{type: load}]",
            "scorers[0].weight: is required",
            id="scorer-without-weight",
        ),
        pytest.param(
            "name: x\nscorers: [{type: magic, weight: 1}]",
            "scorers[0].type: must be one of",
            id="unknown-scorer",
        ),
        pytest.param(
            "name: x\nscorers: [{type: load, weight: 1, colour: red}]",
            "scorers[0].colour: unknown field",
            id="unknown-scorer-field",
        ),
        pytest.param(
            "name: x\nscorers: [{type: load, weight: 1, metric: watts}]",
            "scorers[0].metric: must be one of",
            id="bad-metric",
        ),
        pytest.param(
            "name: x\nblock_chars: 3\npicker: round-robin",
            "block_chars: must be an integer from 16",
            id="block-too-small",
        ),
        pytest.param(
            "name: x\nblock_chars: true\npicker: round-robin",
            "block_chars: must be an integer",
            id="bool-is-not-int",
        ),
        pytest.param(
            "name: x\npicker: max-score",
            "scorers: picker max-score needs at least one scorer",
            id="no-scorers",
        ),
        pytest.param(
            "name: x\npicker: ring\nscorers: [{type: load, weight: 1}]",
            "picker ring ignores scorers",
            id="ring-with-scorers",
        ),
        pytest.param(
            "name: x\nscorers: [{type: load, weight: 0}]",
            "at least one scorer needs a weight",
            id="all-zero-weights",
        ),
        pytest.param(
            "name: x\nscorers: [{type: load, weight: 1}, {type: load, weight: 2}]",
            "scorers[1].type: 'load' is given twice",
            id="duplicate-scorer",
        ),
        pytest.param(
            "name: x\nfilters: [{type: bounded-load, epsilon: -1}]\npicker: ring",
            "filters[0].epsilon",
            id="negative-epsilon",
        ),
        pytest.param(
            "name: x\nindex: {ttl_seconds: forever}\npicker: ring",
            "index.ttl_seconds",
            id="bad-ttl",
        ),
        pytest.param("- a\n- b", "(top level): must be a mapping", id="not-a-mapping"),
        pytest.param("name: [unclosed", "line 1, column", id="invalid-yaml"),
    ],
)
def test_policy_bad_file_error_names_file_field_reason(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, "policies/x.yaml")
    assert str(err.value).startswith("policies/x.yaml: ")
    assert message in str(err.value)


def test_policy_defaults_fill_missing_fields() -> None:
    p = load_policy_text("name: x\nscorers: [{type: prefix-overlap, weight: 1}]", "x")
    assert p.block_chars == 512 and p.bounded_load is None and p.cold_prefix == "ring"


def test_policy_missing_file_is_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


def test_policy_check_cli_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscorers: [{type: load, weight: high}]\n")
    cmd = [sys.executable, "-m", "router.cli", "policy", "check"]
    ok = subprocess.run(
        [*cmd, str(preset_path("kv-aware"))], capture_output=True, text=True, cwd=ROOT
    )
    assert ok.returncode == 0 and "ok:" in ok.stdout
    res = subprocess.run([*cmd, str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1
    assert f"{bad}: scorers[0].weight: must be a number" in res.stderr


@pytest.mark.parametrize("name", NAMES)
def test_policy_chart_copy_equals_preset(name: str) -> None:
    # Helm can only package files inside the chart, so it carries copies of the presets.
    chart_copy = ROOT / "helm" / "kvrouter" / "policies" / f"{name}.yaml"
    assert chart_copy.read_text() == preset_path(name).read_text()


policy_keys = st.sampled_from(
    ["version", "name", "description", "block_chars", "scorers", "type", "weight", "metric",
     "header", "user_field", "max_sessions", "wait_tokens", "running_tokens", "kv_pressure",
     "picker", "cold_prefix", "ring", "epsilon", "min_cap", "filters", "index", "max_entries",
     "ttl_seconds", "engine_capacity_tokens", "hot_prefix", "spread_above"]
)  # fmt: skip
policy_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from([*SCORER_TYPES, "requests", "tokens", "max-score", "ring", "score", "x"])
)
policies = st.recursive(
    policy_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(policy_keys | st.integers(), inner),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(policies.map(yaml.safe_dump), st.text(max_size=200)))
def test_fuzz_policy_any_file_policy_or_policy_error(text: str) -> None:
    try:
        got = load_policy_text(text, "fuzz.yaml")
    except PolicyError as e:
        assert str(e).startswith("fuzz.yaml: ")
        return
    assert isinstance(got, Policy) and got.name
