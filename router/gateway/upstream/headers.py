"""What crosses the gateway: which headers go each way, and the ``usage`` read from answers.

Pure functions over values, like ``router.gateway.openai.sse``: the exchange calls them, tests feed
them bytes. The gateway reports the engines' prefix-cache hits from ``usage.prompt_tokens`` and
``usage.prompt_tokens_details.cached_tokens`` (or the Responses and Messages APIs' own fields,
``usage_counts``): in a non-streamed answer's JSON, or in a stream's last usage event, found
from the stream's tail without decoding the whole stream.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, TypeGuard

import orjson
from multidict import CIMultiDict, MultiMapping

from router.gateway.openai import sse

# Connection-level headers (RFC 9110 section 7.6.1) belong to one hop and are never relayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Also not sent to engines: the engine's own Host, a length aiohttp recomputes, the
# client's encodings (engines answer uncompressed so the gateway can read ``usage``), and the
# body's encoding, which aiohttp has already decoded (a gzip body is forwarded plain).
_NOT_TO_ENGINE = HOP_BY_HOP | {
    "host",
    "content-length",
    "accept-encoding",
    "expect",
    "content-encoding",
}
# What of an engine's response headers a client gets, on every answer, errors included: how to
# read the body, when to come back, the rate limits it is under. Anything else (Set-Cookie,
# X-Internal-*, Server, an engine's own version and host names) stays here.
TO_CLIENT = frozenset({"content-type", "cache-control", "retry-after", "x-request-id"})
TO_CLIENT_PREFIXES = ("x-ratelimit-", "openai-", "anthropic-ratelimit-")

# Bytes kept from the end of a stream to find its final usage event in.
USAGE_TAIL_BYTES = 16 * 1024


# X-Forwarded-For is dropped as it comes and appended again, with the client's address; an
# X-Request-Id is replaced by the request's own id when the gateway gives one.
_DROPPED_TO_ENGINE = _NOT_TO_ENGINE | {"x-forwarded-for"}
# The client's credentials for the gateway are not the engines' business (engines get their
# own); a client can write any forwarding header it likes, so by default none is believed.
CLIENT_CREDENTIALS = frozenset({"authorization", "cookie", "x-api-key"})
CLIENT_FORWARDING = frozenset({"forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto"})
# W3C trace context: replaced by the router's own when it traces (router.gateway.tracing).
TRACE_CONTEXT = frozenset({"traceparent", "tracestate"})
# The dropped set for each (pass_credentials, trust_forwarding, replace_request_id,
# replace_trace_context), built once: no set is made per request on the common path.
_DROP: dict[tuple[bool, bool, bool, bool], frozenset[str]] = {
    (creds, trust, rid, traced): frozenset(
        _DROPPED_TO_ENGINE
        | (frozenset() if creds else CLIENT_CREDENTIALS)
        | (frozenset() if trust else CLIENT_FORWARDING)
        | ({"x-request-id"} if rid else frozenset())
        | (TRACE_CONTEXT if traced else frozenset())
    )
    for creds in (False, True)
    for trust in (False, True)
    for rid in (False, True)
    for traced in (False, True)
}
_NONE: frozenset[str] = frozenset()


def _connection_named(headers: MultiMapping[str]) -> frozenset[str]:
    if "Connection" not in headers:
        return _NONE
    return frozenset(
        token.strip().lower()
        for value in headers.getall("Connection")
        for token in value.split(",")
        if token.strip()
    )


def engine_headers(
    headers: MultiMapping[str],
    peer: str | None,
    *,
    request_id: str = "",
    pass_credentials: bool = False,
    trust_forwarding: bool = False,
    own_trace_context: bool = False,
) -> list[tuple[str, str]]:
    """The client's headers as the engine gets them: no hop-by-hop, X-Forwarded-For appended.

    Unless asked, the client's ``Authorization``, ``x-api-key`` and ``Cookie`` stay here, and its
    forwarding headers (``Forwarded``, ``X-Real-IP``, ``X-Forwarded-*``) are dropped,
    X-Forwarded-For then naming only the peer: behind a trusted proxy, ``trust_forwarding``
    keeps the chain. With ``request_id``, the engine gets it as X-Request-Id (vLLM takes it as
    its own). With ``own_trace_context`` the client's ``traceparent`` and ``tracestate`` stay
    here: each attempt adds the router's own.
    """
    named = _connection_named(headers)
    drop = _DROP[pass_credentials, trust_forwarding, bool(request_id), own_trace_context]
    if named:
        drop = drop | named
    out = [(k, v) for k, v in headers.items() if k.lower() not in drop]
    if request_id:
        out.append(("X-Request-Id", request_id))
    chain = ""
    if trust_forwarding and "X-Forwarded-For" in headers:
        chain = ", ".join(headers.getall("X-Forwarded-For"))
    if peer:
        chain = f"{chain}, {peer}" if chain else peer
    if chain:
        out.append(("X-Forwarded-For", chain))
    out.append(("Accept-Encoding", "identity"))
    return out


def _to_client(name: str) -> bool:
    low = name.lower()
    return low in TO_CLIENT or low.startswith(TO_CLIENT_PREFIXES)


def client_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """The engine's response headers a client gets: only ``TO_CLIENT`` and the
    ``TO_CLIENT_PREFIXES`` (repeated ones kept), never one the engine's Connection names."""
    named = _connection_named(headers)
    return CIMultiDict(
        [(k, v) for k, v in headers.items() if _to_client(k) and k.lower() not in named]
    )


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) from a ``usage`` object, when both are given: chat's
    (``prompt_tokens``, ``prompt_tokens_details.cached_tokens``), Responses' (``input_tokens``,
    ``input_tokens_details.cached_tokens``) or Anthropic's (``input_tokens`` beside
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, which it does not count)."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        prompt, details = usage.get("prompt_tokens"), usage.get("prompt_tokens_details")
    else:
        prompt, details = usage.get("input_tokens"), usage.get("input_tokens_details")
    if details is None and "cache_read_input_tokens" in usage:
        cached, created = (
            usage.get("cache_read_input_tokens"),
            usage.get("cache_creation_input_tokens"),
        )
        if _count(prompt) and _count(cached):
            return prompt + cached + (created if _count(created) else 0), cached
        return None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if _count(prompt) and _count(cached):
        return prompt, cached
    return None


def _usage_of(obj: Any) -> Any:
    """The ``usage`` of an answer or event: its own, a Responses event's ``response.usage``, or
    Anthropic's ``message_start`` ``message.usage``."""
    if not isinstance(obj, dict):
        return None
    if "usage" in obj:
        return obj["usage"]
    inner = obj.get("response", obj.get("message"))
    return inner.get("usage") if isinstance(inner, dict) else None


def _count(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def body_usage(body: bytes) -> tuple[int, int] | None:
    """(prompt, cached) tokens from a non-streamed JSON answer, when it reports both."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return usage_counts(_usage_of(obj))


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class UsageTail:
    """The last bytes of a stream, to read its final ``usage`` event without decoding it all.

    Its first event is kept too (``keep`` bytes at most): Anthropic's stream reports its input
    tokens in its first event (``message_start``), which a long stream's tail has lost.
    """

    __slots__ = ("_cut", "_head", "_heading", "_keep", "_parts", "_size")

    def __init__(self, keep: int = USAGE_TAIL_BYTES) -> None:
        self._parts: deque[bytes] = deque()
        self._size = 0
        self._keep = keep
        self._cut = False  # bytes were dropped from the front: the tail starts mid-event
        self._head = b""
        self._heading = True  # the first event has not ended yet

    def feed(self, chunk: bytes) -> None:
        if self._heading:
            head = self._head + chunk if self._head else chunk
            end = head.find(b"\n\n", 0, self._keep)
            self._heading = end == -1 and len(head) < self._keep
            self._head = head if self._heading else head[: end + 2 if end != -1 else self._keep]
        self._parts.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._parts[0]) >= self._keep:
            self._size -= len(self._parts.popleft())
            self._cut = True

    def usage(self) -> tuple[int, int] | None:
        """(prompt, cached) tokens of the last event that reports them."""
        found = _last_usage(b"".join(self._parts), self._cut)
        if found is None and self._cut and self._head:
            return _last_usage(self._head, False)
        return found

    def json_usage(self) -> tuple[int, int] | None:
        """(prompt, cached) tokens of a non-streamed JSON answer ending in this tail."""
        data = b"".join(self._parts)
        if not self._cut:
            return body_usage(data)
        # OpenAI's answers end with their usage object: take the last one, braces matched.
        start = data.find(b"{", data.rfind(b'"usage"') + 1)
        depth = 0
        for end in range(max(start, 0), len(data) if start > 0 else 0):
            depth += {0x7B: 1, 0x7D: -1}.get(data[end], 0)
            if depth == 0:
                try:
                    return usage_counts(orjson.loads(data[start : end + 1]))
                except orjson.JSONDecodeError:
                    return None
        return None


_SEPARATORS = (b"\n\n", b"\r\r", b"\r\n\r\n")


# A usage object whose members nest one level at most (token details), as every API's do.
_USAGE_OBJECT = re.compile(rb'"usage"[ \t]*:[ \t]*(\{(?:[^{}]++|\{[^{}]*+\})*+\})')


def _last_usage(data: bytes, cut: bool) -> tuple[int, int] | None:
    """(prompt, cached) tokens of the last event in ``data`` that reports them (``cut``: the
    data starts mid-event)."""
    end = len(data)
    # Newest first. The usage object alone is parsed where it can be cut out whole (its
    # event's start and size do not matter then: a Responses stream's last event carries the
    # whole response); else the event that holds it is decoded.
    while (at := data.rfind(b'"usage"', 0, end)) != -1:
        m = _USAGE_OBJECT.match(data, at)
        if m is not None:
            try:
                counts = usage_counts(orjson.loads(m.group(1)))
            except orjson.JSONDecodeError:
                counts = None
            if counts is not None:
                return counts
            end = at
            continue
        found = ((data.rfind(sep, 0, at), len(sep)) for sep in _SEPARATORS)
        start = max((i + n for i, n in found if i != -1), default=0)
        if start == 0 and cut:
            return None  # that event's beginning was cut off
        m_end = _EVENT_END.search(data, at)
        for ev in sse.Decoder().feed(data[start : m_end.end() if m_end else end] + b"\n\n"):
            counts = _event_usage(ev)
            if counts is not None:
                return counts
        end = start
    return None


def _event_usage(ev: sse.Event) -> tuple[int, int] | None:
    if ev.done or '"usage"' not in ev.data:
        return None
    try:
        obj = orjson.loads(ev.data)
    except orjson.JSONDecodeError:
        return None
    return usage_counts(_usage_of(obj))


# The first id in a Responses answer's first bytes is the response's own: the body's ``id``
# leads it, and a stream's first event (``response.created``) names its ``response.id`` first.
_FIRST_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


def response_id(first: bytes) -> str | None:
    """The response id a Responses answer's first bytes give, if they give one."""
    m = _FIRST_ID.search(first)
    return m.group(1).decode("utf-8", "replace") if m else None
