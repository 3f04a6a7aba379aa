"""Token ids from the model's own tokenizer file and chat template, with no call to an engine.

``--tokenizer PATH`` (``engines.kv_events.tokenizer: PATH``) names a Hugging Face
``tokenizer.json``, or the folder of a model's files that holds one. The chat template is the
folder's ``chat_template.jinja`` if there is one, else ``tokenizer_config.json``'s
``chat_template`` (a string, or named templates of which ``default`` is taken); the special
tokens a template names (``bos_token``, ``eos_token``, ...) come from ``tokenizer_config.json``.

The ids must be the ones the engine computes, so the rules are the engines': messages render as
``apply_chat_template(messages, tools=..., add_generation_prompt=True)`` does (a sandboxed
Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, ``tojson``, ``raise_exception``
and ``strftime_now``) and the text is encoded without added special tokens, since the template
writes its own; a plain prompt is encoded with them, as vLLM's completions do. Text content
parts are joined with newlines (vLLM's "string" content format). Anything this cannot render
as the engine would (images, a list of prompts, no chat template) raises ``ValueError``, and
the router keys that request on its text instead.

``tokenizers.Tokenizer.encode`` holds the GIL; ``encode_batch_fast`` releases it while it
works, so the gateway tokenizes on worker threads without stalling its event loop
(router.gateway.precise.tokenize).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from router.core.fields import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# The special tokens transformers hands a chat template by name.
SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    # As transformers' templates expect: no HTML escaping, unlike Jinja's own tojson.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes a special token as its text or as {"content": text, ...}.
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_source(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / TEMPLATE_FILE
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        for t in template:
            if isinstance(t, Mapping) and t.get("name") == "default":
                source = t.get("template")
                return source if isinstance(source, str) else None
    return None


def _content(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError(f"{where}: a text part without text")
                texts.append(text)
            else:
                raise ValueError(f"{where}: only text parts render locally")
        return "\n".join(texts)
    raise ValueError(f"{where}: content must be a string or an array of parts")


class LocalTokenizer:
    """A model's tokenizer and chat template, loaded from its files."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        template: str | None = None,
        special: Mapping[str, str] | None = None,
        source: str = "",
    ) -> None:
        self._tokenizer = tokenizer
        self._special = dict(special or {})
        self.source = source
        try:
            self._template = _environment().from_string(template) if template else None
        except jinja2.TemplateError as e:
            raise ValueError(f"{source or 'chat template'}: the chat template: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> LocalTokenizer:
        """The tokenizer at ``path`` (a tokenizer.json, or a folder holding one); raises
        ``ValueError`` saying what is missing or broken."""
        p = Path(path)
        file = p / TOKENIZER_FILE if p.is_dir() else p
        if not file.is_file():
            raise ValueError(f"{path}: no {TOKENIZER_FILE} there")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises plain Exceptions
            raise ValueError(f"{file}: not a tokenizer file: {e}") from None
        config: Mapping[str, Any] = {}
        config_file = file.parent / CONFIG_FILE
        if config_file.is_file():
            try:
                loaded = json.loads(config_file.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{config_file}: not JSON: {e}") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"{config_file}: must be a JSON object")
            config = loaded
        special = {
            name: text
            for name in SPECIAL_TOKENS
            if (text := _token_text(config.get(name))) is not None
        }
        return cls(tok, _template_source(file.parent, config), special, str(file))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render(self, messages: Sequence[Any], tools: Any = None) -> str:
        """The conversation as the chat template writes it, ready for the answer."""
        if self._template is None:
            raise ValueError("the tokenizer has no chat template; chat requests cannot render")
        msgs = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise ValueError(f"messages[{i}] must be an object")
            msg = dict(m)
            if "content" in msg:
                msg["content"] = _content(msg["content"], f"messages[{i}].content")
            msgs.append(msg)
        try:
            return self._template.render(
                messages=msgs, tools=tools or None, add_generation_prompt=True, **self._special
            )
        except Exception as e:  # a template is the model's code: whatever it raises, no ids
            raise ValueError(f"the chat template failed: {e}") from None

    def encode(self, text: str, special_tokens: bool) -> list[int]:
        # The batch call releases the GIL (encode does not), and its "fast" form skips the
        # character offsets nobody here reads: about half the time of encode_batch.
        batch = self._tokenizer.encode_batch_fast([text], add_special_tokens=special_tokens)
        return list(batch[0].ids)

    def text_of(self, body: Mapping[str, Any]) -> tuple[str, bool]:
        """The text the engine encodes for a chat or completions body, and whether special
        tokens are added to it (a plain prompt's) or written by the chat template."""
        messages = body.get("messages")
        if messages is not None:
            if not isinstance(messages, list):
                raise ValueError("'messages' must be an array")
            return self.render(messages, body.get("tools")), False
        prompt = body.get("prompt", body.get("input"))
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ValueError("only a 'prompt' string or 'messages' tokenize locally")
        return prompt, True

    def ids(self, body: Mapping[str, Any]) -> list[int]:
        """The token ids the engine computes for a chat or completions body."""
        return self.encode(*self.text_of(body))


def configured(setting: str, key: str = "engines.kv_events.tokenizer") -> LocalTokenizer | None:
    """The tokenizer a ``tokenizer`` setting names (None for ``engine``); raises
    ``ConfigError`` naming ``key``, the setting as the user wrote it, when it cannot be loaded."""
    if setting == "engine":
        return None
    try:
        return LocalTokenizer.load(setting)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
