"""An inbound request as engine-sim needs it: the gateway's reading, plus an engine's fields.

The body is parsed, and its prompt canonicalised, by the gateway's own
``router.gateway.openai.request.parse``, so router and engine read a request one way; every refusal
is one of the gateway's error classes (``router.gateway.openai.errors``), which the app renders in
vLLM's dialect. On top of that come the fields only an engine reads: ``stream_options``,
``max_tokens`` (``max_completion_tokens`` for chat; clamped to ``MAX_TOKENS_CAP``), ``n``, a
completions batch of prompts, SGLang's ``rid``, the embeddings ``input`` and
``encoding_format``, and on chat and completions the disaggregation fields
(``router.enginesim.disagg_wire``). The bodies of ``POST /fault`` and ``POST /abort_request``
are read here too. Nothing here does I/O.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from router.core.blocks import RoutingText
from router.enginesim.disagg_wire import NONE, PdFields, parse_pd
from router.enginesim.engine import FAULT_MODES, Fault, SimSettings
from router.enginesim.tokens import prefix_keys, prompt_text, prompt_tokens, text_tokens
from router.gateway.openai.errors import BadRequest, NotFound
from router.gateway.openai.request import Inbound, json_object, parse

DEFAULT_MAX_TOKENS = 16
# Far above any benchmark's output length, low enough that one request cannot pin the engine.
MAX_TOKENS_CAP = 4096
MAX_CHOICES = 16
EMBEDDINGS = "/v1/embeddings"


class Endpoint(enum.Enum):
    """The generation routes; they differ in field names and response objects."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"
    MESSAGES = "/v1/messages"


# The field that limits the output, per route (chat may say ``max_completion_tokens`` instead).
MAX_TOKENS_FIELD = {
    Endpoint.CHAT: "max_tokens",
    Endpoint.COMPLETIONS: "max_tokens",
    Endpoint.RESPONSES: "max_output_tokens",
    Endpoint.MESSAGES: "max_tokens",
}
# Routes whose streams always report usage, and that know no ``n`` or ``stream_options``.
FRONT_DOORS = frozenset({Endpoint.RESPONSES, Endpoint.MESSAGES})
# The routes the engines' disaggregation serves (and the peers' proxies split).
PD_ROUTES = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})


@dataclass(frozen=True, slots=True)
class Generation:
    """A validated generation request, reduced to what the engine model needs."""

    endpoint: Endpoint
    stream: bool
    include_usage: bool
    max_tokens: int
    finish_reason: str
    choices: int
    prompt_tokens: int
    keys: tuple[int, ...]
    seed: int
    text: RoutingText | None = None  # the canonical prompt, for the KV events' token ids
    rid: str | None = None  # SGLang's request id field, when the body names one
    # Responses: the conversation in the chat form, stored turns first (router.enginesim.stored)
    history: tuple[Mapping[str, Any], ...] = ()
    pd: PdFields = NONE  # what it says of prefill/decode disaggregation


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """A validated embeddings request: its inputs as text, and how to encode the vectors."""

    inputs: tuple[str, ...]
    prompt_tokens: int
    base64: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_bool(body: Mapping[str, Any], name: str, where: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{where}{name}' must be a boolean", where + name)
    return value


def _opt_int(
    body: Mapping[str, Any], name: str, default: int, lo: int, hi: int, *, clamp: bool = False
) -> int:
    """An integer field in [lo, hi]; with ``clamp``, values above ``hi`` become ``hi``."""
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise BadRequest(f"'{name}' must be an integer", name)
    if value < lo:
        raise BadRequest(f"'{name}' must be at least {lo}, got {value}", name)
    if value > hi and not clamp:
        raise BadRequest(f"'{name}' must be at most {hi}, got {value}", name)
    return min(int(value), hi)


def _served(raw: bytes, route: str, settings: SimSettings) -> Inbound:
    inbound = parse(raw, route)
    if inbound.model != settings.model:
        raise NotFound(f"The model `{inbound.model}` does not exist.", "model")
    return inbound


def _batch_size(prompt: Any) -> int:
    # A list of prompts is a batch: one choice per prompt, as OpenAI's completions API does.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def parse_generation(
    raw: bytes,
    endpoint: Endpoint,
    settings: SimSettings,
    history: Callable[[Inbound], Inbound] | None = None,
) -> Generation:
    """Validate a generation body; raises a ``RequestError`` naming the field.

    ``history``: what a Responses request continues, its stored turns put before its own.
    """
    inbound = _served(raw, endpoint.value, settings)
    if history is not None:
        inbound = history(inbound)
    body = inbound.body
    options = body.get("stream_options") if endpoint not in FRONT_DOORS else None
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    if options is not None and not inbound.stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", "stream")
    include_usage = endpoint in FRONT_DOORS or _opt_bool(
        options or {}, "include_usage", "stream_options."
    )
    name = MAX_TOKENS_FIELD[endpoint]
    if endpoint is Endpoint.CHAT and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"
    if endpoint is Endpoint.MESSAGES and name not in body:
        raise BadRequest(f"'{name}' is required", name)
    max_tokens = _opt_int(body, name, DEFAULT_MAX_TOKENS, 1, MAX_TOKENS_CAP, clamp=True)
    n = _opt_int(body, "n", 1, 1, MAX_CHOICES) if endpoint not in FRONT_DOORS else 1
    batch = _batch_size(body.get("prompt")) if endpoint is Endpoint.COMPLETIONS else 1
    text = prompt_text(inbound, settings.tokenizer)
    tokens = prompt_tokens(text)
    keys = prefix_keys(text, settings.spec.block_tokens)
    return Generation(
        endpoint=endpoint,
        stream=inbound.stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        # A request that set no limit ends "naturally"; one that did runs into it.
        finish_reason="stop" if body.get(name) is None else "length",
        choices=n * batch,
        prompt_tokens=tokens,
        keys=tuple(keys),
        seed=keys[-1] if keys else tokens,
        text=text,
        rid=body["rid"] if isinstance(body.get("rid"), str) else None,
        history=tuple(inbound.chat["messages"]) if inbound.chat is not None else (),
        pd=parse_pd(body) if endpoint in PD_ROUTES else NONE,
    )


def _embedding_inputs(value: Any) -> list[tuple[str, int]]:
    """Each input as (text to embed, tokens it counts); token ids embed as their spelling."""
    if isinstance(value, str):
        return [(value, text_tokens(value))]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [(v, text_tokens(v)) for v in value]
        if all(_is_int(v) for v in value):
            return [(" ".join(map(str, value)), len(value))]
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return [(" ".join(map(str, v)), len(v)) for v in value]
    raise BadRequest(
        "'input' must be a string, an array of strings, an array of token ids "
        "or an array of token-id arrays",
        "input",
    )


def parse_embedding(raw: bytes, settings: SimSettings) -> EmbeddingRequest:
    """Validate an embeddings body; raises a ``RequestError`` naming the field."""
    inbound = _served(raw, EMBEDDINGS, settings)
    body = inbound.body
    if "input" in body:
        inputs = _embedding_inputs(body["input"])
    else:  # a conversation, as vLLM embeds it: its canonical text is one input
        inputs = [(inbound.text.text or "", prompt_tokens(inbound.text))]
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    return EmbeddingRequest(
        inputs=tuple(text for text, _ in inputs),
        prompt_tokens=sum(n for _, n in inputs),
        base64=fmt == "base64",
    )


def parse_fault(raw: bytes) -> Fault | None:
    """A ``POST /fault`` body -> the fault to arm (None for ``clear``); raises ``BadRequest``."""
    body = json_object(raw)
    mode = body.get("mode")
    if mode == "clear":
        return None
    if mode not in FAULT_MODES:
        modes = ", ".join([*FAULT_MODES, "clear"])
        raise BadRequest(f"'mode' must be one of {modes}; got {mode!r}", "mode")
    count = _opt_int(body, "count", 1, 1, sys.maxsize)
    every = _opt_int(body, "every", 1, 1, 1000)
    if mode != "status":
        return Fault(mode, count, every=every)
    status = body.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise BadRequest("'status' must be an integer from 400 to 599", "status")
    return Fault(mode, count, status, every)


def parse_abort(raw: bytes) -> str | None:
    """A ``POST /abort_request`` body -> the rid to stop (None: ``abort_all``)."""
    body = json_object(raw)
    if body.get("abort_all") is True:
        return None
    rid = body.get("rid")
    if not isinstance(rid, str) or not rid:
        raise BadRequest("'rid' must be a non-empty string (or give 'abort_all': true)", "rid")
    return rid
