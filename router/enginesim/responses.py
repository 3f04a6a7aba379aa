"""The bodies engine-sim answers with, shaped like vLLM's OpenAI server; values in, bytes out.

``Reply`` renders one generation: its stream events (the assistant role first for chat, one
event per output token and choice, the finish events, the usage event when asked for, then
``[DONE]``) and its non-streamed body. ``embeddings_body`` renders deterministic unit vectors.
The timing of the events is the app's business; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import base64
import math
import struct
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from router.enginesim.requests import EmbeddingRequest, Endpoint, Generation
from router.enginesim.tokens import output_token
from router.gateway.openai import sse

EMBEDDING_DIM = 16


@dataclass(frozen=True, slots=True)
class Reply:
    """One response's identity and text; renders its stream chunks and its full body."""

    gen: Generation
    model: str
    cached: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    # Top-level fields the non-streamed body carries besides OpenAI's (vLLM's
    # ``kv_transfer_params``).
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def _chat(self) -> bool:
        return self.gen.endpoint is Endpoint.CHAT

    def token(self, i: int, choice: int) -> str:
        """Output token ``i`` of ``choice``."""
        return output_token(self.gen.seed, i, choice)

    def text(self, choice: int) -> str:
        """The whole output of ``choice``."""
        return "".join(self.token(i, choice) for i in range(self.gen.max_tokens))

    def usage(self) -> dict[str, Any]:
        completion = self.gen.max_tokens * self.gen.choices
        return {
            "prompt_tokens": self.gen.prompt_tokens,
            "total_tokens": self.gen.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        prefix = "chatcmpl-" if self._chat else "cmpl-"
        chunk = {
            "id": prefix + self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return sse.encode(orjson.dumps(chunk))

    def _choice(self, c: int, text: str, finish: str | None) -> dict[str, Any]:
        if self._chat:
            delta = {"content": text} if finish is None else {}
            return {"index": c, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "index": c,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }

    def head(self) -> bytes:
        """What precedes the first token: the assistant role, for chat."""
        if not self._chat:
            return b""
        role = {"role": "assistant", "content": ""}
        return b"".join(
            self._event([{"index": c, "delta": role, "logprobs": None, "finish_reason": None}])
            for c in range(self.gen.choices)
        )

    def tokens(self, start: int, stop: int) -> bytes:
        """Events for output tokens ``start`` to ``stop`` of every choice."""
        return b"".join(
            self._event([self._choice(c, self.token(i, c), None)])
            for i in range(start, stop)
            for c in range(self.gen.choices)
        )

    def tail(self) -> bytes:
        """The finish events, the usage event when asked for, and ``[DONE]``."""
        parts = [
            self._event([self._choice(c, "", self.gen.finish_reason)])
            for c in range(self.gen.choices)
        ]
        if self.gen.include_usage:
            parts.append(self._event([], usage=self.usage()))
        parts.append(sse.DONE)
        return b"".join(parts)

    def full(self) -> bytes:
        """The non-streamed response body."""
        choices: list[dict[str, Any]] = []
        for c in range(self.gen.choices):
            choice: dict[str, Any] = {"index": c}
            if self._chat:
                choice["message"] = {"role": "assistant", "content": self.text(c), "tool_calls": []}
            else:
                choice["text"] = self.text(c)
            choice.update(logprobs=None, finish_reason=self.gen.finish_reason, stop_reason=None)
            choices.append(choice)
        return orjson.dumps(
            {
                "id": ("chatcmpl-" if self._chat else "cmpl-") + self.id,
                "object": "chat.completion" if self._chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
                **self.extra,
            }
        )


def embedding(text: str) -> list[float]:
    """A deterministic unit vector of ``EMBEDDING_DIM`` floats for ``text``."""
    data = text.encode("utf-8", "surrogatepass")
    raw = [xxhash.xxh3_64_intdigest(data, seed) / 2**63 - 1.0 for seed in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def embeddings_body(req: EmbeddingRequest, model: str) -> bytes:
    """The embeddings response: one vector per input, as floats or base64 float32."""
    data = []
    for i, text in enumerate(req.inputs):
        vector = embedding(text)
        value: Any = vector
        if req.base64:
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    usage = {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    return orjson.dumps(
        {
            "id": "embd-" + uuid.uuid4().hex,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage,
        }
    )


def models_body(model: str, created: int) -> bytes:
    """``GET /v1/models``: the one served model, in OpenAI's list shape."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "kvrouter",
        "root": model,
        "parent": None,
    }
    return orjson.dumps({"object": "list", "data": [card]})
