"""The field reader and YAML loading behind policies and configs: bounded, whatever the file."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.core.fields import (
    MAX_YAML_ALIASES,
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    ConfigError,
    Fields,
    parse_yaml,
    show,
)
from router.core.policy import Policy, PolicyError, load_policy_text


class _Fields(Fields):
    error = ConfigError


def alias_bomb(levels: int = 9, fanout: int = 9) -> str:
    """The billion laughs: each level a list of ``fanout`` aliases of the level below."""
    lines = [f"l0: &l0 [{','.join(['lol'] * fanout)}]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * fanout)}]")
    return "\n".join(lines) + "\n"


# -- limits: size, aliases, nesting ----------------------------------------------------------


def test_yaml_alias_bomb_refused_naming_file_and_line() -> None:
    text = alias_bomb()
    assert len(text) < 500
    with pytest.raises(ConfigError) as e:
        parse_yaml(text, "bomb.yaml", ConfigError)
    msg = str(e.value)
    assert msg.startswith("bomb.yaml: line ")
    assert f"more than {MAX_YAML_ALIASES} aliases" in msg


def test_yaml_alias_bomb_as_policy_value_refused_quickly() -> None:
    # Before the alias limit, the error message rendered the whole expanded value first.
    text = "name: x\nscorers: [{type: load, weight: 1}]\n" + alias_bomb()
    text += "description: *l9\n"
    with pytest.raises(PolicyError, match="aliases"):
        load_policy_text(text, "bomb.yaml")


def test_yaml_a_few_aliases_still_load() -> None:
    text = "a: &x {b: 1}\n" + "".join(f"k{i}: *x\n" for i in range(MAX_YAML_ALIASES))
    data = parse_yaml(text, "ok.yaml", ConfigError)
    assert data["k0"] == {"b": 1} and len(data) == MAX_YAML_ALIASES + 1


@pytest.mark.parametrize(
    "text", ["[" * 5000, "a:\n" + "".join(" " * i + "- \n" for i in range(1, 200))]
)
def test_yaml_deep_nesting_refused_not_recursion_error(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_yaml(text, "deep.yaml", ConfigError)
    assert str(e.value).startswith("deep.yaml: ")


def test_yaml_nesting_at_the_limit_loads() -> None:
    depth = MAX_YAML_DEPTH - 1  # the document's own mapping is one level
    text = "a: " + "[" * depth + "]" * depth
    assert parse_yaml(text, "ok.yaml", ConfigError) is not None


def test_yaml_text_over_size_limit_refused_before_parsing() -> None:
    text = "a: [" + "1, " * (MAX_YAML_BYTES // 3) + "1]"
    with pytest.raises(ConfigError, match=f"larger than the {MAX_YAML_BYTES}-byte limit"):
        parse_yaml(text, "big.yaml", ConfigError)


def test_yaml_non_ascii_text_limit_counts_bytes() -> None:
    text = "a: " + "é" * (MAX_YAML_BYTES // 2)  # fewer characters than the limit, more bytes
    with pytest.raises(ConfigError, match="limit"):
        parse_yaml(text, "big.yaml", ConfigError)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a: 2024-02-30", "day is out of range"),
        ("a: " + "1" * 5000, "Exceeds the limit"),
        ("a: !!binary 'abc'", "invalid YAML"),
        ("? [1, 2]\n: x", "invalid YAML"),
    ],
    ids=["bad-date", "huge-int", "bad-binary", "list-key"],
)
def test_yaml_scalars_python_cannot_build_are_errors(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_yaml(text, "x.yaml", ConfigError)
    assert str(e.value).startswith("x.yaml: ") and says in str(e.value)


# -- quoting values in messages ------------------------------------------------------------


def test_show_walks_only_a_few_elements_of_an_alias_bomb() -> None:
    data = yaml.safe_load(alias_bomb(levels=12, fanout=10))  # 10**12 leaves through shared lists
    text = show(data["l12"])
    assert len(text) <= 60 and text.startswith("[[[")


@pytest.mark.parametrize(
    "value",
    ["x" * 10**6, 10**4000, b"\x00" * 10**6, {str(i): i for i in range(10**5)}, [[[[[[[1]]]]]]]],
    ids=["long-str", "huge-int", "bytes", "big-dict", "deep-list"],
)
def test_show_is_short(value: Any) -> None:
    assert 0 < len(show(value)) <= 60


def test_show_short_values_in_full() -> None:
    assert show("high") == "'high'"
    assert show([1, 2]) == "[1, 2]"


# -- the field reader ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({1: "a", "b": "x"}, "1"),
        ({None: 1, "b": "x", 2.5: 0}, "2.5"),
        ({"x" * 1000: 1}, "x" * 57 + "..."),
    ],
    ids=["int-key", "null-and-float-keys", "long-key"],
)
def test_fields_unknown_keys_of_any_type_named(data: dict[Any, Any], path: str) -> None:
    f = _Fields(data, "", "c.yaml")
    f.text("b", "")
    with pytest.raises(ConfigError) as e:
        f.done()
    assert str(e.value) == f"c.yaml: {path}: unknown field"


@pytest.mark.parametrize("value", [10**400, -(10**400), float("inf"), float("nan")])
def test_fields_number_out_of_range_not_overflow(value: float) -> None:
    f = _Fields({"n": value}, "", "c.yaml")
    with pytest.raises(ConfigError, match=r"n: must be a number from 0\.0 to 10\.0"):
        f.number("n", 1.0, 0.0, 10.0)


# -- fuzzing: a policy file is a policy or a PolicyError, never anything else ----------------

policy_keys = st.sampled_from(
    ["version", "name", "description", "block_chars", "filters", "scorers", "picker",
     "cold_prefix", "index", "type", "weight", "metric", "header", "user_field",
     "max_sessions", "epsilon", "engine_capacity_tokens", "ttl_seconds", "max_entries"]
)  # fmt: skip
yaml_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["load", "prefix-overlap", "max-score", "ring", "requests", "x"])
)
policy_like = st.recursive(
    yaml_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(policy_keys | st.integers(), inner),
    max_leaves=20,
)
# YAML's own syntax, to reach the scanner and parser: anchors, aliases, tags, flow and blocks.
yaml_tokens = st.sampled_from(
    ["name: x\n", "scorers:\n", "- {type: load, weight: 1}\n", "  ", "&a ", "*a ", "*b ", "[",
     "]", "{", "}", ": ", ", ", "- ", "? ", "!!str ", "!!binary ", "!!set ", "!!timestamp ",
     "2024-13-45", "1e999", "'", '"', "#", "\n", "|\n", ">\n", "---\n", "...\n", "%YAML 1.1\n",
     "\t", "\\", "\x00", "é", "\ud800"]
)  # fmt: skip
fuzz = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _policy_or_error(text: str) -> None:
    try:
        got = load_policy_text(text, "fuzz.yaml")
    except PolicyError as e:
        assert str(e).startswith("fuzz.yaml: ")
        return
    assert isinstance(got, Policy)


@fuzz
@given(policy_like)
def test_fuzz_policy_any_document_policy_or_policy_error(data: Any) -> None:
    _policy_or_error(yaml.safe_dump(data))


@fuzz
@given(st.lists(yaml_tokens, max_size=40).map("".join))
def test_fuzz_policy_any_yaml_syntax_policy_or_policy_error(text: str) -> None:
    _policy_or_error(text)


@fuzz
@given(st.text(max_size=300))
def test_fuzz_policy_any_text_policy_or_policy_error(text: str) -> None:
    _policy_or_error(text)
