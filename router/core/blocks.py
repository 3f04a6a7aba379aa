"""An OpenAI request body -> canonical routing text -> chained block keys.

The routing text is built from the parsed fields in a fixed order, so JSON key order and
whitespace never change it. Tool definitions come first (chat templates put them in the
system preamble, and they rarely change within a conversation), then every message in order.
A conversation that grows by appending messages therefore keeps its earlier text as a prefix,
which is what an engine's prefix cache sees too. Responses and Messages bodies are first put in
the chat form (``router.core.chat_form``), so a conversation keys alike through all three APIs.

Blocks are ``block_chars`` characters (about a quarter as many tokens for English text; a
token-id prompt uses ``block_chars // 4`` ids per block). Only full blocks get keys: a partial
tail can never be matched in full by a later request. Each key is xxh3_64 of the block seeded
with the previous key (the first with a hash of the namespace), so a key names the whole prefix
up to and including its block, and keys of different models never meet.

Any JSON the gateway accepts gets a routing text or a ``RequestShapeError``: tool definitions,
tool calls and unknown content parts are canonicalised with the standard ``json`` encoder,
whose recursion a body nested about a thousand levels deep (orjson parses up to 1024)
exhausts; that is a ``RequestShapeError`` naming the field, not a crash. Token-id prompts are
kept packed, four bytes an id, not as Python ints (36 bytes each).

Token-exact keys (``token_keys``) are the same chain over token ids cut at an engine's block
size: the keys an engine's KV cache events are given (``core.engine_blocks``) and the keys a
request's token ids are asked by (``core.precise``), so the two meet exactly.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from router.core import hotpath

_xxh3 = xxhash.xxh3_64_intdigest

# Separators that do not occur in ordinary text keep fields from running into each other:
# ("ab", "c") and ("a", "bc") must not produce the same routing text.
_RS = "\x1e"  # before each message
_US = "\x1f"  # between fields of a message

# How many characters stand for one token in block sizing; a common estimate for English.
CHARS_PER_TOKEN = 4


class RequestShapeError(ValueError):
    """The body lacks, or mistypes, a field routing needs. ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class RoutingText:
    """What a request is routed on: its namespace and its prompt (text, or token ids).

    ``routing_text`` packs token ids into an ``array('I')`` (each id modulo 2**32, as block
    keys read them; never changed after); any sequence of ints is accepted.
    """

    namespace: str
    text: str | None = None
    token_ids: Sequence[int] | None = None

    @property
    def approx_tokens(self) -> int:
        if self.token_ids is not None:
            return len(self.token_ids)
        return len(self.text or "") // CHARS_PER_TOKEN


def namespace_of(body: Mapping[str, Any]) -> str:
    """The model, and the LoRA adapter when the request names one (SGLang: ``lora_path``)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestShapeError("'model' must be a non-empty string", "model")
    adapter = body.get("lora_adapter", body.get("lora_path"))
    if isinstance(adapter, str) and adapter:
        return f"{model}{_US}lora{_US}{adapter}"
    return model


def canonical_json(value: Any, where: str) -> str:
    """``value`` as compact JSON with sorted keys; ``RequestShapeError`` when nested too deeply."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise RequestShapeError(f"'{where}' is nested too deeply", where) from None


def _digest(data: str) -> str:
    return xxhash.xxh3_64_hexdigest(data.encode("utf-8", "surrogatepass"))


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestShapeError(f"'{where}' must be a string or an array of content parts", where)
    parts: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, Mapping):
            raise RequestShapeError(f"'{where}[{i}]' must be an object", f"{where}[{i}]")
        kind = part.get("type")
        if kind == "text" or (kind is None and "text" in part):
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestShapeError(f"'{where}[{i}].text' must be a string", f"{where}[{i}]")
            parts.append(text)
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise RequestShapeError(
                    f"'{where}[{i}].image_url.url' must be a string", f"{where}[{i}]"
                )
            # An image is as large as its data URL; its hash stands for it in the text.
            parts.append(f"<image:{_digest(url)}>")
        else:
            # Audio, files and future part types: route on a digest of their canonical form.
            parts.append(f"<{kind}:{_digest(canonical_json(part, f'{where}[{i}]'))}>")
    return "\n".join(parts)


def _chat_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("'messages' must be a non-empty array", "messages")
    out: list[str] = []
    tools_field = "tools" if "tools" in body else "functions"
    tools = body.get(tools_field)
    if tools:
        out.append(f"{_RS}tools{_US}{canonical_json(tools, tools_field)}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise RequestShapeError(f"'messages[{i}]' must be an object", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str):
            raise RequestShapeError(f"'messages[{i}].role' must be a string", f"messages[{i}].role")
        text = _content_text(msg.get("content"), f"messages[{i}].content")
        out.append(f"{_RS}{role}{_US}{text}")
        name = msg.get("name")
        if isinstance(name, str):
            out.append(f"{_US}name{_US}{name}")
        calls_field = "tool_calls" if "tool_calls" in msg else "function_call"
        calls = msg.get(calls_field)
        if calls:
            out.append(f"{_US}calls{_US}{canonical_json(calls, f'messages[{i}].{calls_field}')}")
        call_id = msg.get("tool_call_id")
        if isinstance(call_id, str):
            out.append(f"{_US}id{_US}{call_id}")
    return "".join(out)


_INT = frozenset({int})


def _is_token_list(value: Sequence[Any]) -> bool:
    # The types in one C-level pass (bool is not int here): a 2-million-id prompt is checked
    # several times faster than by isinstance per element.
    return set(map(type, value)) <= _INT


def packed_ids(ids: Iterable[int]) -> array[int]:
    """Token ids as an ``array('I')``, each modulo 2**32."""
    if isinstance(ids, array) and ids.typecode == "I":
        return ids
    if not isinstance(ids, Sequence):
        ids = list(ids)
    try:
        return array("I", ids)
    except OverflowError:  # negative, or beyond 32 bits: the low 32 bits, as before
        return array("I", [t & 0xFFFFFFFF for t in ids])


def routing_text(body: Mapping[str, Any]) -> RoutingText:
    """Canonical routing text of a chat or completions body; raises ``RequestShapeError``."""
    namespace = namespace_of(body)
    if "messages" in body:
        return RoutingText(namespace, text=_chat_text(body))
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return RoutingText(namespace, text=prompt)
    if isinstance(prompt, list) and prompt:
        if _is_token_list(prompt):
            return RoutingText(namespace, token_ids=packed_ids(prompt))
        if all(isinstance(p, str) for p in prompt):
            # A batch of prompts goes to one engine together: route on all of them in order.
            return RoutingText(namespace, text=_RS.join(prompt))
        if all(isinstance(p, list) and p and _is_token_list(p) for p in prompt):
            ids = array("I")
            for p in prompt:
                ids.extend(packed_ids(p))
            return RoutingText(namespace, token_ids=ids)
    field = "input" if "input" in body and "prompt" not in body else "prompt"
    raise RequestShapeError(
        f"'{field}' must be a string, an array of strings or an array of token ids "
        "(or send 'messages' for chat)",
        field,
    )


def namespace_seed(namespace: str) -> int:
    return _xxh3(namespace.encode("utf-8", "surrogatepass"))


def block_keys(rt: RoutingText, block_chars: int) -> list[int]:
    """Chained xxh3_64 keys of the full blocks of ``rt``'s prompt."""
    seed = namespace_seed(rt.namespace)
    if rt.token_ids is not None:
        per_block = max(1, block_chars // CHARS_PER_TOKEN)
        return _chain(packed_ids(rt.token_ids), per_block * 4, seed)
    text = rt.text or ""
    native = hotpath.native
    if native is not None:
        return native.text_chain(text, block_chars, seed)
    if text.isascii():
        # One character is one byte: encode once and cut the bytes.
        return _chain(text.encode("ascii"), block_chars, seed)
    keys: list[int] = []
    h = seed
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = _xxh3(text[start : start + block_chars].encode("utf-8", "surrogatepass"), h)
        keys.append(h)
    return keys


def _chain(data: bytes | array[int], size: int, seed: int) -> list[int]:
    """Chained keys of the full blocks of ``size`` bytes of ``data``."""
    native = hotpath.native
    if native is not None:
        return native.chain(data, size, seed)
    # The reference: one C call per block, no generator. Slicing a memoryview hands xxhash
    # the block without copying it (half the cost of a bytes slice).
    view = memoryview(data).cast("B")
    keys: list[int] = []
    append = keys.append
    h = seed
    for start in range(0, len(view) - size + 1, size):
        h = _xxh3(view[start : start + size], h)
        append(h)
    return keys


def chain_keys(chunks: Iterable[bytes | memoryview], seed: int) -> list[int]:
    """Chained xxh3_64 over ``chunks``: each key is seeded with the one before it."""
    keys: list[int] = []
    append = keys.append
    h = seed
    for chunk in chunks:
        h = _xxh3(chunk, h)
        append(h)
    return keys


# -- token-exact keys --------------------------------------------------------------------------


def token_seed(lora_name: str | None = None) -> int:
    """The chain's seed for token keys: the LoRA adapter when there is one."""
    return namespace_seed(f"{_US}tokens{_US}{lora_name or ''}")


def token_blocks(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The full blocks of ``block_size`` token ids, packed (what a token key hashes)."""
    data = packed_ids(token_ids).tobytes()
    size = block_size * 4
    return [data[i : i + size] for i in range(0, len(data) - size + 1, size)]


def token_keys(
    token_ids: Sequence[int], block_size: int, lora_name: str | None = None
) -> list[int]:
    """Chained xxh3_64 keys of the full blocks of ``block_size`` token ids."""
    return _chain(packed_ids(token_ids), block_size * 4, token_seed(lora_name))
