"""The local tokenizer: a model's files loaded, its chat template applied as the engines do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from router.core.fields import ConfigError
from router.enginesim.model_files import BOS, write_tokenizer
from router.local_tokenizer import LocalTokenizer, configured

HELLO = [{"role": "user", "content": "keep answers short"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("model"))


def test_folder_and_file_load_the_same_tokenizer(model: Path) -> None:
    by_folder = LocalTokenizer.load(model)
    by_file = LocalTokenizer.load(model / "tokenizer.json")
    assert by_folder.ids({"messages": HELLO}) == by_file.ids({"messages": HELLO})
    assert by_folder.has_chat_template


def test_chat_renders_the_template_then_encodes_without_added_tokens(model: Path) -> None:
    tok = LocalTokenizer.load(model)
    text = tok.render(HELLO)
    assert text == f"{BOS}<|im_start|>user\nkeep answers short<|im_end|>\n<|im_start|>assistant\n"
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tok.ids({"messages": HELLO})
    assert ids == raw.encode(text, add_special_tokens=False).ids
    bos = raw.token_to_id(BOS)
    assert bos is not None and ids.count(bos) == 1  # the template's, not a second one


def test_prompt_encodes_with_the_special_tokens(model: Path) -> None:
    tok = LocalTokenizer.load(model)
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tok.ids({"prompt": "rule 7 keep answers short"})
    assert ids[0] == raw.token_to_id(BOS)
    assert ids == tok.ids({"prompt": ["rule 7 keep answers short"]})  # a batch of one
    assert ids[1:] == raw.encode("rule 7 keep answers short", add_special_tokens=False).ids


def test_text_parts_join_with_newlines(model: Path) -> None:
    tok = LocalTokenizer.load(model)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]
    assert tok.render(parts) == tok.render([{"role": "user", "content": "a\nb"}])


def test_chat_template_file_wins_over_the_config(tmp_path: Path) -> None:
    folder = write_tokenizer(tmp_path)
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    assert LocalTokenizer.load(folder).render(HELLO) == "[keep answers short]"


def test_named_templates_take_default(tmp_path: Path) -> None:
    folder = write_tokenizer(tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{{ messages[0].content | upper }}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert LocalTokenizer.load(folder).render(HELLO) == "KEEP ANSWERS SHORT"


def test_tools_reach_the_template_as_json(tmp_path: Path) -> None:
    folder = write_tokenizer(tmp_path, template="{{ tools | tojson }}|{{ messages | length }}")
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert LocalTokenizer.load(folder).render(HELLO, tools) == json.dumps(tools) + "|1"


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
        {"messages": "not an array"},
        {"messages": ["not an object"]},
        {"prompt": ["two", "prompts"]},
        {"prompt": 7},
        {},
    ],
)
def test_what_cannot_render_as_the_engine_would_is_a_value_error(
    model: Path, body: dict[str, object]
) -> None:
    with pytest.raises(ValueError):
        LocalTokenizer.load(model).ids(body)


def test_a_template_that_raises_is_a_value_error(tmp_path: Path) -> None:
    folder = write_tokenizer(tmp_path, template="{{ raise_exception('no system role') }}")
    with pytest.raises(ValueError, match="no system role"):
        LocalTokenizer.load(folder).ids({"messages": HELLO})


def test_the_template_cannot_reach_python_internals(tmp_path: Path) -> None:
    folder = write_tokenizer(tmp_path, template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError):
        LocalTokenizer.load(folder).render(HELLO)


def test_no_template_refuses_chat_but_tokenizes_prompts(tmp_path: Path) -> None:
    tok = LocalTokenizer.load(write_tokenizer(tmp_path, template=None))
    assert not tok.has_chat_template
    assert tok.ids({"prompt": "rule"})
    with pytest.raises(ValueError, match="no chat template"):
        tok.ids({"messages": HELLO})


def test_missing_or_broken_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        LocalTokenizer.load(tmp_path / "absent")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizer file"):
        LocalTokenizer.load(tmp_path)
    folder = write_tokenizer(tmp_path / "bad-config")
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        LocalTokenizer.load(folder)
    folder = write_tokenizer(tmp_path / "bad-template", template="{% for %}")
    with pytest.raises(ValueError, match="chat template"):
        LocalTokenizer.load(folder)


def test_configured_unloadable_names_the_key_the_user_wrote(tmp_path: Path) -> None:
    assert configured("engine") is None
    with pytest.raises(
        ConfigError, match=r"^backends\.kv_events\.tokenizer: .*absent: no tokenizer\.json"
    ):
        configured(str(tmp_path / "absent"), "backends.kv_events.tokenizer")
