"""An inbound OpenAI request: the body parsed once, and the few fields routing needs, checked.

The gateway forwards the client's original bytes; it reads only ``model``, the prompt
(``messages``, ``prompt`` or ``input``, which the routing core canonicalises; a Responses or
Messages body in its chat form, with ``instructions`` or ``system``), ``stream`` and ``user``.
Everything else is the engine's business. Any input, however malformed, ends here as a
``BadRequest`` that says which field is wrong and why, never as another exception.

Memory and the event loop stay bounded however large the body (``BodyParser``): parsing costs
several times a body's size for a moment (a token id is 7 bytes of JSON and 36 bytes as a
Python int; a one-word chat message 38 bytes of JSON and a few hundred as a dict), so bodies above
``limits.large_body_bytes`` are parsed in a worker thread, at most
``limits.max_large_body_parses`` at a time, and what an exchange keeps afterwards is small: the
routing text (token ids packed, four bytes each) and the body's top-level scalar fields (the
raw bytes are what is forwarded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from router.core.blocks import RequestShapeError, RoutingText, namespace_of, routing_text
from router.core.chat_form import from_messages, from_responses
from router.core.scorers.session_affinity import session_fields
from router.gateway.openai.errors import BadRequest

# Bodies larger than this are parsed in a worker thread. A 1 MiB body parses in 2 ms (one
# long text) to 80 ms (25,000 one-word messages) on a 2-core machine: the longest the event
# loop waits for a parse on it.
LARGE_BODY_BYTES = 1024 * 1024
# Parses hold the GIL: a second one at once would not finish sooner, only double the memory.
MAX_LARGE_BODY_PARSES = 1
_SCALARS = (str, int, float, bool, type(None))

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
# Each generation route and the prompt field it requires.
PROMPT_FIELD: dict[str, str] = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    RESPONSES: "input",
    MESSAGES: "messages",
    COUNT_TOKENS: "messages",
}
# Front doors whose bodies are read in the chat form (router.core.chat_form).
CHAT_FORM: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    RESPONSES: from_responses,
    MESSAGES: from_messages,
    COUNT_TOKENS: from_messages,
}
# Routes checked like the others but routed on no prefix: nothing to find in a cache.
UNROUTED = frozenset({COUNT_TOKENS})


@dataclass(frozen=True, slots=True)
class Inbound:
    """A validated request: its parsed body, routing text, model and stream flag.

    From ``BodyParser`` (unless ``keep_body``), ``body`` holds only the body's top-level
    scalar fields (``model``, ``stream``, ``user``, ``priority``...) and the nested ids a session
    may be named by (``session_affinity.session_fields``): the prompt is in ``text``.
    ``chat``: a Responses or Messages body in the chat form (``router.core.chat_form``), kept
    with the body, for the engines' chat templates.
    """

    body: Mapping[str, Any]
    text: RoutingText
    model: str
    stream: bool
    chat: Mapping[str, Any] | None = None

    @property
    def prompt_body(self) -> Mapping[str, Any]:
        """The body in a form a chat template takes: ``chat`` when there is one."""
        return self.body if self.chat is None else self.chat


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
    if required not in body and not (route == "/v1/embeddings" and "messages" in body):
        raise BadRequest(f"'{required}' is required for {route}", required)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {_type_name(stream)}", "stream")
    chat = None
    try:
        convert = CHAT_FORM.get(route)
        if convert is not None:
            chat = convert(body)
        if route in UNROUTED:
            text, chat = RoutingText(namespace_of(body), text=""), None
        else:
            text = routing_text(body if chat is None else chat)
    except RequestShapeError as e:
        raise BadRequest(str(e), e.param) from None
    return Inbound(body, text, model, bool(stream), chat)


def _light(inbound: Inbound) -> Inbound:
    """``inbound`` keeping of its body only the top-level scalars (the prompt is in its text)."""
    body = {k: v for k, v in inbound.body.items() if isinstance(v, _SCALARS)}
    body.update(session_fields(inbound.body))  # the nested ids a session may be named by
    return Inbound(body, inbound.text, inbound.model, inbound.stream)  # no chat: no template


def _parse_light(raw: bytes, route: str) -> Inbound:
    return _light(parse(raw, route))


class BodyParser:
    """``parse`` for the gateway: large bodies off the event loop, a few at a time.

    ``keep_body``: keep the whole parsed body (for code that reads the prompt's fields again).
    """

    def __init__(
        self,
        large_bytes: int = LARGE_BODY_BYTES,
        max_large: int = MAX_LARGE_BODY_PARSES,
        *,
        keep_body: bool = False,
    ) -> None:
        self.large_bytes = large_bytes
        self._slots = asyncio.Semaphore(max_large)
        self._parse = parse if keep_body else _parse_light

    async def parse(self, raw: bytes, route: str) -> Inbound:
        """``parse(raw, route)``, keeping only what the gateway reads after it (see ``Inbound``)."""
        if len(raw) <= self.large_bytes:
            return self._parse(raw, route)
        await self._slots.acquire()
        try:
            work = asyncio.get_running_loop().run_in_executor(None, self._parse, raw, route)
        except BaseException:
            self._slots.release()
            raise
        # The slot is held until the thread is done, even if the client leaves first: a
        # thread cannot be stopped, and its memory counts until it ends.
        work.add_done_callback(self._done)
        return await asyncio.shield(work)

    def _done(self, work: asyncio.Future[Inbound]) -> None:
        self._slots.release()
        if not work.cancelled():
            work.exception()  # retrieved: nobody may be left awaiting it
