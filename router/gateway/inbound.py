"""An inbound OpenAI request: the body parsed once, and the few fields routing needs, checked.

The gateway forwards the client's original bytes; it reads only ``model``, the prompt
(``messages``, ``prompt`` or ``input``, which the routing core canonicalises), ``stream`` and
``user``. Everything else is the engine's business. Any input, however malformed, ends here as a
``BadRequest`` that says which field is wrong and why, never as another exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from router.core.blocks import RequestShapeError, RoutingText, routing_text
from router.gateway.errors import BadRequest

# Each generation route and the prompt field it requires.
PROMPT_FIELD: dict[str, str] = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
}


@dataclass(frozen=True, slots=True)
class Inbound:
    """A validated request: its parsed body, routing text, model and stream flag."""

    body: Mapping[str, Any]
    text: RoutingText
    model: str
    stream: bool


def _type_name(v: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if v is None:
        return "null"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return "a number"
    return names.get(type(v), type(v).__name__)


def json_object(raw: bytes) -> dict[str, Any]:
    """A body that must be one JSON object; raises ``BadRequest`` saying what it is instead."""
    if not raw:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {_type_name(body)}")
    return body


def parse(raw: bytes, route: str) -> Inbound:
    """Parse and check a body for ``route``; raises ``BadRequest`` naming the field at fault."""
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        got = "missing" if model is None else f"got {_type_name(model)}"
        raise BadRequest(f"'model' must be a non-empty string ({got})", "model")
    required = PROMPT_FIELD[route]
    # vLLM also embeds chat conversations: an embeddings body may send 'messages' instead.
    if required not in body and not (required == "input" and "messages" in body):
        raise BadRequest(f"'{required}' is required for {route}", required)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {_type_name(stream)}", "stream")
    try:
        text = routing_text(body)
    except RequestShapeError as e:
        raise BadRequest(str(e), e.param) from None
    return Inbound(body, text, model, bool(stream))


def session_key(value: str) -> str:
    """A session's key: 32 hex digits of xxh3_128, whatever the length of ``value``."""
    return xxhash.xxh3_128_hexdigest(value.encode("utf-8", "surrogatepass"))


def session_of(
    inbound: Inbound, headers: Mapping[str, str], header: str | None, user_field: bool
) -> str | None:
    """The session key for affinity, of the policy's header, else of the body's ``user``."""
    if header:
        value = headers.get(header)
        if value:
            return session_key(value)
    if user_field:
        user = inbound.body.get("user")
        if isinstance(user, str) and user:
            return session_key(user)
    return None
