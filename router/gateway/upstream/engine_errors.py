"""An engine's error answer, reduced to what a client may see.

An engine that refuses a request (a 4xx) says why, and the client should hear it: "this
model's maximum context length is 4096 tokens" is the answer. But engines also put their
insides into those bodies: a Python traceback, file paths of the server and its weights, the
repr of an internal object. ``public_error`` keeps the message when it is a plain message,
cut at the first trace of internals and at ``max_chars``, and the error's type and code when
they are short names; everything else of the body stays here. Pure: bytes in, values out.

It reads the shapes engines answer in: OpenAI's ``{"error": {...}}``, vLLM's and SGLang's
top-level ``{"object": "error", "message", "type", "code"}``, FastAPI's ``{"detail": ...}``,
and Anthropic's ``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

# What a client is told when nothing the engine said may go out.
GENERIC = "the engine refused the request"
MAX_CHARS = 500
# Names are words like invalid_request_error or BadRequestError; anything else is dropped.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# Where internals begin: a traceback, a frame line, a file path, an object's repr, an address.
_INTERNALS = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\bFile \""
    r"|(?:^|[\s(\"'=:])(?!/v1/)(?:/[\w.@+-]+){3,}"  # a path three deep: not an API route
    r"|[\w.-]+\.(?:py|pyc|so|safetensors|bin|gguf|pt|pth)\b"
    r"|\b[A-Za-z]:\\[\w\\.-]+"
    r"|<[\w.]+ object at 0x[0-9a-f]+>"
    r"|\b0x[0-9a-f]{8,}\b"
)


@dataclass(frozen=True, slots=True)
class PublicError:
    """What of an engine's error a client gets: its message, and type and code if named."""

    message: str
    type: str | None = None
    code: str | int | None = None


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # FastAPI's validation details: a list of {"msg": ...}
        msgs = [d.get("msg") for d in value if isinstance(d, dict)]
        parts = [m for m in msgs if isinstance(m, str)]
        return "; ".join(parts) if parts else None
    return None


def _fields(body: Any) -> tuple[str | None, Any, Any]:
    """(message, type, code) wherever the body's shape keeps them."""
    if not isinstance(body, dict):
        return None, None, None
    inner = body.get("error")
    if isinstance(inner, dict):
        return _text(inner.get("message")), inner.get("type"), inner.get("code")
    if isinstance(inner, str):
        return inner, body.get("type"), body.get("code")
    if "message" in body:
        return _text(body.get("message")), body.get("type"), body.get("code")
    return _text(body.get("detail")), None, None


def clean(message: str, max_chars: int = MAX_CHARS) -> str:
    """``message`` up to the first sign of internals and at most ``max_chars`` characters
    (an ellipsis says it was cut); empty when it begins with them."""
    m = _INTERNALS.search(message)
    cut = " ".join((message[: m.start()] if m else message).split())  # one line, as shown
    if m:
        cut = cut.rstrip(" :;,(\"'=")  # what led into the part cut off
    if len(cut) > max_chars:
        cut = cut[: max(0, max_chars - 1)].rstrip() + "…"
    return cut


def public_error(body: bytes, max_chars: int = MAX_CHARS) -> PublicError:
    """The client's share of an engine's error ``body`` (any bytes; never raises)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return PublicError(GENERIC)
    message, type_, code = _fields(parsed)
    text = clean(message, max_chars) if message else ""
    name = type_ if isinstance(type_, str) and _NAME.match(type_) else None
    if isinstance(code, bool) or not (
        (isinstance(code, int) and 0 <= code < 10_000)
        or (isinstance(code, str) and _NAME.match(code))
    ):
        code = None
    return PublicError(text or GENERIC, name, code)
