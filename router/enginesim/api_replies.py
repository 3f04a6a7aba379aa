"""The Responses and Messages answers engine-sim gives, in those APIs' own shapes and events.

Each is a ``Reply`` (router.enginesim.responses) with the same parts the app paces, so a
stream's head, tokens and tail leave as chat completions' do; only their shapes differ:

    Responses (OpenAI)              response.created, response.in_progress,
                                    response.output_item.added, response.content_part.added,
                                    response.output_text.delta per token,
                                    response.output_text.done, response.content_part.done,
                                    response.output_item.done, response.completed
                                    (each ``event: TYPE`` with a ``sequence_number``)
    Messages (Anthropic)            message_start, content_block_start, ping,
                                    content_block_delta per token, content_block_stop,
                                    message_delta, message_stop

Usage reports the prefix cache's hits as each API does: Responses ``input_tokens`` with
``input_tokens_details.cached_tokens``; Messages ``input_tokens`` *beside*
``cache_read_input_tokens`` (Anthropic counts the cached tokens apart, not in the input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.enginesim.requests import Endpoint, Generation
from router.enginesim.responses import Reply
from router.enginesim.stored import ResponseStore
from router.gateway.openai import sse

# How each API says why the answer ended, for a natural end and for running into the limit.
_RESPONSES_STATUS = {"stop": ("completed", None), "length": ("incomplete", "max_output_tokens")}
_MESSAGES_STOP = {"stop": "end_turn", "length": "max_tokens"}
# Events before the first token's (response.created ... content_part.added).
_HEAD_EVENTS = 4


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return sse.encode(orjson.dumps({"type": kind, **payload}), kind)


@dataclass(frozen=True, slots=True)
class ResponsesReply(Reply):
    """One answer of ``POST /v1/responses``."""

    @property
    def response_id(self) -> str:
        return "resp_" + self.id

    @property
    def _item_id(self) -> str:
        return "msg_" + self.id

    def usage(self) -> dict[str, Any]:
        out = self.gen.max_tokens
        return {
            "input_tokens": self.gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.gen.prompt_tokens + out,
        }

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, done: bool) -> dict[str, Any]:
        content = [self._part(self.text(0))] if done else []
        status = "completed" if done else "in_progress"
        return {
            "id": self._item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _response(self, done: bool) -> dict[str, Any]:
        status, reason = (
            _RESPONSES_STATUS[self.gen.finish_reason] if done else ("in_progress", None)
        )
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": None,
            "max_output_tokens": None,
            "model": self.model,
            "output": [self._item(True)] if done else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "store": True,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": self.usage() if done else None,
            "metadata": {},
        }

    def _at(self, content: bool = True) -> dict[str, Any]:
        at: dict[str, Any] = {"item_id": self._item_id, "output_index": 0}
        if content:
            at["content_index"] = 0
        return at

    def head(self) -> bytes:
        return b"".join(
            [
                _event(
                    "response.created", {"sequence_number": 0, "response": self._response(False)}
                ),
                _event(
                    "response.in_progress",
                    {"sequence_number": 1, "response": self._response(False)},
                ),
                _event(
                    "response.output_item.added",
                    {"sequence_number": 2, "output_index": 0, "item": self._item(False)},
                ),
                _event(
                    "response.content_part.added",
                    {"sequence_number": 3, **self._at(), "part": self._part("")},
                ),
            ]
        )

    def tokens(self, start: int, stop: int) -> bytes:
        return b"".join(
            _event(
                "response.output_text.delta",
                {
                    "sequence_number": _HEAD_EVENTS + i,
                    **self._at(),
                    "delta": self.token(i, 0),
                    "logprobs": [],
                },
            )
            for i in range(start, stop)
        )

    def tail(self) -> bytes:
        seq = _HEAD_EVENTS + self.gen.max_tokens
        text = self.text(0)
        return b"".join(
            [
                _event(
                    "response.output_text.done",
                    {"sequence_number": seq, **self._at(), "text": text, "logprobs": []},
                ),
                _event(
                    "response.content_part.done",
                    {"sequence_number": seq + 1, **self._at(), "part": self._part(text)},
                ),
                _event(
                    "response.output_item.done",
                    {"sequence_number": seq + 2, "output_index": 0, "item": self._item(True)},
                ),
                _event(
                    "response.completed",
                    {"sequence_number": seq + 3, "response": self._response(True)},
                ),
            ]
        )

    def full(self) -> bytes:
        return orjson.dumps(self._response(True))


@dataclass(frozen=True, slots=True)
class MessagesReply(Reply):
    """One answer of ``POST /v1/messages``."""

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.gen.prompt_tokens - self.cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached,
            "output_tokens": self.gen.max_tokens,
        }

    def _message(self, done: bool) -> dict[str, Any]:
        usage = self.usage()
        if not done:
            usage["output_tokens"] = 0
        return {
            "id": "msg_" + self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": self.text(0)}] if done else [],
            "stop_reason": _MESSAGES_STOP[self.gen.finish_reason] if done else None,
            "stop_sequence": None,
            "usage": usage,
        }

    def head(self) -> bytes:
        block = {"type": "text", "text": ""}
        return b"".join(
            [
                _event("message_start", {"message": self._message(False)}),
                _event("content_block_start", {"index": 0, "content_block": block}),
                _event("ping", {}),
            ]
        )

    def tokens(self, start: int, stop: int) -> bytes:
        return b"".join(
            _event(
                "content_block_delta",
                {"index": 0, "delta": {"type": "text_delta", "text": self.token(i, 0)}},
            )
            for i in range(start, stop)
        )

    def tail(self) -> bytes:
        delta = {"stop_reason": _MESSAGES_STOP[self.gen.finish_reason], "stop_sequence": None}
        return b"".join(
            [
                _event("content_block_stop", {"index": 0}),
                _event("message_delta", {"delta": delta, "usage": self.usage()}),
                _event("message_stop", {}),
            ]
        )

    def full(self) -> bytes:
        return orjson.dumps(self._message(True))


def reply_for(gen: Generation, model: str, cached: int, store: ResponseStore) -> Reply:
    """The answer to ``gen`` in its route's shape; a Responses answer is stored in ``store``."""
    if gen.endpoint is Endpoint.MESSAGES:
        return MessagesReply(gen, model, cached)
    if gen.endpoint is not Endpoint.RESPONSES:
        return Reply(gen, model, cached)
    reply = ResponsesReply(gen, model, cached)
    store.keep(reply.response_id, gen.history, reply.text(0))
    return reply
