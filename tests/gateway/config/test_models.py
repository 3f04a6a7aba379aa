"""The models section: aliases and patterns, their errors, and the request they rewrite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from router.core.fields import ConfigError
from router.gateway.config.models import MAX_ALIASES, ModelAliases
from router.gateway.config.reload import ModelsWatcher, Result
from router.gateway.config.settings import load_config_text
from router.gateway.openai.request import parse


def aliases(text: str) -> ModelAliases:
    return load_config_text(text, "c.yaml").models


def test_models_absent_is_no_alias() -> None:
    assert aliases("") == ModelAliases()
    assert aliases("models: {}").served("m") is None


def test_aliases_exact_and_chains_followed_to_the_served_name() -> None:
    m = aliases("models: {aliases: {fast: small, small: llama-3-8b, big: llama-3-70b}}")
    assert m.aliases == {"fast": "llama-3-8b", "small": "llama-3-8b", "big": "llama-3-70b"}
    assert [m.served(x) for x in ("fast", "big", "llama-3-8b", "other")] == [
        "llama-3-8b",
        "llama-3-70b",
        None,
        None,
    ]


def test_patterns_in_order_first_match_wins_after_exact_aliases() -> None:
    m = aliases(
        """
models:
  aliases: {gpt-4o-mini: small}
  patterns:
    - {match: "gpt-4o*", model: big}
    - {match: "gpt-?", model: small}
    - {match: "claude-*-sonnet*", model: big}
"""
    )
    cases = {
        "gpt-4o-mini": "small",  # the exact alias before any pattern
        "gpt-4o": "big",
        "gpt-4o-2024-08-06": "big",
        "gpt-4": "small",
        "gpt-45": None,  # ? is one character
        "claude-3-7-sonnet-latest": "big",
        "GPT-4": None,  # case matters
        "gpt-4o.x": "big",
        "a.b": None,  # a dot is a dot
    }
    assert {k: m.served(k) for k in cases} == cases


def test_pattern_target_followed_through_aliases_and_self_match_is_no_rewrite() -> None:
    m = aliases("models: {aliases: {small: s-8b}, patterns: [{match: 's*', model: small}]}")
    assert m.served("sonnet") == "s-8b"
    assert m.served("s-8b") is None  # the pattern names what was asked for: nothing to do


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: {aliases: {a: a}}", "models.aliases.a: the alias names itself"),
        ("models: {aliases: {a: b, b: a}}", "models.aliases.a: the alias is part of a cycle"),
        ("models: {aliases: {a: b, b: c, c: b}}", "(b -> c -> b)"),
        ("models: {aliases: {a: ''}}", "models.aliases.a: must be a model name of 1 to 256"),
        ("models: {aliases: {a: [x]}}", "models.aliases.a: must be a model name"),
        ("models: {aliases: {1: x}}", "must be a model name"),
        ("models: {aliases: [a, b]}", "models.aliases: must be a mapping"),
        ("models: {patterns: [{match: 'a*'}]}", "models.patterns[0].model: is required"),
        ("models: {patterns: [{model: x}]}", "models.patterns[0].match: is required"),
        ("models: {patterns: [{match: x, model: y, z: 1}]}", "patterns[0].z: unknown field"),
        ("models: {patterns: {match: x}}", "models.patterns: must be a list"),
        ("models: {alias: {}}", "models.alias: unknown field"),
        ("models: [1]", "models: must be a mapping"),
    ],
    ids=lambda v: v if len(v) < 40 else v[:40],
)
def test_models_invalid_is_a_config_error_naming_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        aliases(text)
    assert expected in str(e.value)


def test_models_bounded_in_count() -> None:
    many = ", ".join(f"a{i}: m" for i in range(MAX_ALIASES + 1))
    with pytest.raises(ConfigError, match="at most 10000 aliases"):
        aliases(f"models: {{aliases: {{{many}}}}}")


CHAT = "/v1/chat/completions"


def request(model: str, **extra: Any) -> tuple[Any, bytes]:
    raw = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **extra})
    return parse(raw, CHAT), raw


def test_rewrite_renames_model_in_body_bytes_and_routing_namespace() -> None:
    m = aliases("models: {aliases: {fast: llama-3-8b}}")
    inbound, raw = request("fast", stream=True, lora_path=None)
    out, sent = m.rewrite(inbound, raw)
    assert out.model == out.body["model"] == "llama-3-8b" and out.stream
    assert orjson.loads(sent) == {**orjson.loads(raw), "model": "llama-3-8b"}
    served, _ = request("llama-3-8b", stream=True, lora_path=None)
    assert out.text == served.text  # the alias's requests share the served name's keys


def test_rewrite_keeps_a_lora_adapter_in_the_namespace() -> None:
    m = aliases("models: {aliases: {fast: base}}")
    inbound, raw = request("fast", lora_path="adapter-1")
    out, _ = m.rewrite(inbound, raw)
    assert out.text == request("base", lora_path="adapter-1")[0].text


def test_rewrite_without_a_match_sends_the_clients_bytes_as_they_came() -> None:
    m = aliases("models: {aliases: {fast: base}}")
    inbound, raw = request("base")
    out, sent = m.rewrite(inbound, raw)
    assert out is inbound and sent is raw


# -- the config file watched for its models section -------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.models: list[ModelAliases] = []
        self.results: list[Result] = []


def test_models_watcher_applies_a_valid_edit_and_keeps_the_old_aliases_on_a_bad_one(
    tmp_path: Path,
) -> None:
    f = tmp_path / "serve.yaml"
    f.write_text("models: {aliases: {fast: a}}\n")
    rec = Recorder()
    w = ModelsWatcher(f, rec.models.append, rec.results.append, 1.0)
    assert w.load_initial().served("fast") == "a"
    assert w.check() is None  # unchanged
    f.write_text("models: {aliases: {fast: b}}\n")
    assert w.check() == "success" and rec.models[-1].served("fast") == "b"
    f.write_text("models: {aliases: {fast: fast}}\n")
    assert w.check() == "error" and len(rec.models) == 1
    f.write_text("models: {aliases: {fast: b}}\nlimits: {max_attempts: 0}\n")
    assert w.check() == "error", "an error anywhere in the file refuses it whole"
    assert w.check(force=True) == "error"
    assert rec.results == ["success", "error", "error", "error"]
