"""Response bodies and stream events, rendered without a server."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

from router.core.blocks import CHARS_PER_TOKEN
from router.enginesim.requests import Endpoint, parse_embedding, parse_generation
from router.enginesim.responses import EMBEDDING_DIM, Reply, embeddings_body, models_body
from router.gateway.openai.sse import Decoder
from tests.enginesim.support import FAST, MODEL, chat, completion, prompt, raw


def reply(endpoint: Endpoint, body: dict[str, Any], cached: int = 0) -> Reply:
    return Reply(parse_generation(raw(body), endpoint, FAST), MODEL, cached)


def events(data: bytes) -> list[Any]:
    decoded = Decoder().feed(data)
    assert decoded[-1].done
    return [json.loads(e.data) for e in decoded[:-1]]


def test_chat_stream_role_tokens_finish_usage() -> None:
    r = reply(
        Endpoint.CHAT,
        chat(max_tokens=3, stream=True, n=2, stream_options={"include_usage": True}),
        7,
    )
    chunks = events(r.head() + r.tokens(0, 3) + r.tail())
    roles, tokens, finishes, usage = chunks[:2], chunks[2:8], chunks[8:10], chunks[10]
    assert [c["choices"][0]["delta"] for c in roles] == [{"role": "assistant", "content": ""}] * 2
    assert [c["choices"][0]["index"] for c in tokens] == [0, 1] * 3
    texts = ["".join(c["choices"][0]["delta"]["content"] for c in tokens[i::2]) for i in (0, 1)]
    assert texts == [r.text(0), r.text(1)]
    assert [c["choices"][0]["finish_reason"] for c in finishes] == ["length"] * 2
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    assert len(chunks) == 11
    assert {c["id"] for c in chunks} == {"chatcmpl-" + r.id}


def test_completions_stream_no_role_no_usage_unless_asked() -> None:
    r = reply(Endpoint.COMPLETIONS, completion(max_tokens=2, stream=True))
    chunks = events(r.head() + r.tokens(0, 2) + r.tail())
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all("usage" not in c for c in chunks)


@pytest.mark.parametrize(
    ("endpoint", "body", "obj"),
    [
        pytest.param(Endpoint.CHAT, chat(max_tokens=5), "chat.completion", id="chat"),
        pytest.param(Endpoint.COMPLETIONS, completion(max_tokens=5), "text_completion", id="text"),
    ],
)
def test_full_body_shape_and_usage(endpoint: Endpoint, body: dict[str, Any], obj: str) -> None:
    r = reply(endpoint, body, cached=3)
    full = json.loads(r.full())
    assert full["object"] == obj
    (choice,) = full["choices"]
    text = choice["message"]["content"] if endpoint is Endpoint.CHAT else choice["text"]
    assert text == r.text(0)
    assert len(text) == 5 * CHARS_PER_TOKEN
    assert full["usage"] == {
        "prompt_tokens": r.gen.prompt_tokens,
        "total_tokens": r.gen.prompt_tokens + 5,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def test_same_prompt_same_text_other_prompt_other_text() -> None:
    a = reply(Endpoint.COMPLETIONS, completion(prompt(100), max_tokens=8))
    b = reply(Endpoint.COMPLETIONS, completion(prompt(100), max_tokens=8))
    c = reply(Endpoint.COMPLETIONS, completion(prompt(100, start=500), max_tokens=8))
    assert a.text(0) == b.text(0) != c.text(0)


def test_embeddings_deterministic_unit_vectors_float_and_base64() -> None:
    body = {"model": MODEL, "input": ["same text", "other", "same text"]}
    floats = json.loads(embeddings_body(parse_embedding(raw(body), FAST), MODEL))
    packed_req = parse_embedding(raw({**body, "encoding_format": "base64"}), FAST)
    packed = json.loads(embeddings_body(packed_req, MODEL))
    vectors = [d["embedding"] for d in floats["data"]]
    assert [len(v) for v in vectors] == [EMBEDDING_DIM] * 3
    assert vectors[0] == vectors[2] != vectors[1]
    assert math.isclose(math.fsum(x * x for x in vectors[0]), 1.0)
    decoded = struct.unpack(f"<{EMBEDDING_DIM}f", base64.b64decode(packed["data"][0]["embedding"]))
    assert decoded == pytest.approx(vectors[0], abs=1e-6)
    assert floats["usage"]["prompt_tokens"] == packed_req.prompt_tokens


def test_models_body_lists_the_model() -> None:
    body = json.loads(models_body("m-1", 123))
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["created"]) for m in body["data"]] == [("m-1", "model", 123)]
