"""Reading requests: what a generation, an embedding and a fault body become, and refusals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router.core.engine_model import EngineSpec
from router.enginesim.engine import Fault, SimSettings
from router.enginesim.requests import (
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_CAP,
    Endpoint,
    parse_embedding,
    parse_fault,
    parse_generation,
)
from router.gateway.openai.errors import RequestError
from tests.enginesim.support import FAST, MODEL, chat, completion, prompt, raw

SETTINGS = SimSettings(spec=EngineSpec(block_tokens=4), fast=True)


def parser(path: str) -> Callable[[bytes], object]:
    """The parse function behind ``path``."""
    table: dict[str, Callable[[bytes], object]] = {
        "/v1/chat/completions": lambda b: parse_generation(b, Endpoint.CHAT, FAST),
        "/v1/completions": lambda b: parse_generation(b, Endpoint.COMPLETIONS, FAST),
        "/v1/embeddings": lambda b: parse_embedding(b, FAST),
        "/fault": parse_fault,
    }
    return table[path]


BAD_REQUESTS = [
    pytest.param("/v1/chat/completions", b"{bad", 400, None, id="malformed_json_400"),
    pytest.param("/v1/chat/completions", b"", 400, None, id="empty_body_400"),
    pytest.param("/v1/chat/completions", b"[1]", 400, None, id="body_not_object_400"),
    pytest.param("/v1/chat/completions", {"messages": []}, 400, "model", id="no_model_400"),
    pytest.param(
        "/v1/completions", {**completion(), "model": "x"}, 404, "model", id="unknown_model_404"
    ),
    pytest.param("/v1/chat/completions", {"model": MODEL}, 400, "messages", id="no_messages_400"),
    pytest.param(
        "/v1/chat/completions",
        {"model": MODEL, "messages": "hi"},
        400,
        "messages",
        id="messages_not_array_400",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 3}]},
        400,
        "messages[0].content",
        id="content_wrong_type_400",
    ),
    pytest.param("/v1/completions", {"model": MODEL}, 400, "prompt", id="no_prompt_400"),
    pytest.param("/v1/completions", completion({"a": 1}), 400, "prompt", id="prompt_object_400"),
    pytest.param(
        "/v1/completions", completion(max_tokens="5"), 400, "max_tokens", id="max_tokens_string_400"
    ),
    pytest.param(
        "/v1/completions", completion(max_tokens=0), 400, "max_tokens", id="max_tokens_zero_400"
    ),
    pytest.param(
        "/v1/completions", completion(max_tokens=True), 400, "max_tokens", id="max_tokens_bool_400"
    ),
    pytest.param(
        "/v1/chat/completions", chat(stream="yes"), 400, "stream", id="stream_not_bool_400"
    ),
    pytest.param(
        "/v1/chat/completions",
        chat(stream_options={"include_usage": True}),
        400,
        "stream",
        id="stream_options_without_stream_400",
    ),
    pytest.param(
        "/v1/chat/completions",
        chat(stream=True, stream_options=[1]),
        400,
        "stream_options",
        id="stream_options_not_object_400",
    ),
    pytest.param(
        "/v1/chat/completions",
        chat(stream=True, stream_options={"include_usage": 1}),
        400,
        "stream_options.include_usage",
        id="include_usage_not_bool_400",
    ),
    pytest.param("/v1/chat/completions", chat(n=100), 400, "n", id="n_too_large_400"),
    pytest.param("/v1/embeddings", {"model": MODEL}, 400, "input", id="embeddings_no_input_400"),
    pytest.param(
        "/v1/embeddings",
        {"model": MODEL, "input": [1.5]},
        400,
        "input",
        id="embeddings_float_input_400",
    ),
    pytest.param(
        "/v1/embeddings",
        {"model": MODEL, "input": "x", "encoding_format": "hex"},
        400,
        "encoding_format",
        id="embeddings_bad_encoding_400",
    ),
    pytest.param("/fault", b"[]", 400, None, id="fault_not_object_400"),
    pytest.param("/fault", {"mode": "explode"}, 400, "mode", id="fault_unknown_mode_400"),
    pytest.param(
        "/fault", {"mode": "status", "status": 200}, 400, "status", id="fault_status_not_error_400"
    ),
    pytest.param(
        "/fault", {"mode": "status", "status": True}, 400, "status", id="fault_status_bool_400"
    ),
    pytest.param("/fault", {"mode": "hang", "count": 0}, 400, "count", id="fault_count_zero_400"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_parse_bad_request_refused_naming_field(
    path: str, body: Any, status: int, param: str | None
) -> None:
    with pytest.raises(RequestError) as exc:
        parser(path)(raw(body))
    assert exc.value.status == status
    assert exc.value.param == param


def test_parse_generation_counts_tokens_and_keys_full_blocks() -> None:
    gen = parse_generation(raw(completion(prompt(42))), Endpoint.COMPLETIONS, SETTINGS)
    assert gen.prompt_tokens == 42
    assert len(gen.keys) == 10
    assert gen.seed == gen.keys[-1]


def test_parse_generation_defaults() -> None:
    gen = parse_generation(raw(chat()), Endpoint.CHAT, FAST)
    assert (gen.stream, gen.include_usage, gen.choices) == (False, False, 1)
    assert (gen.max_tokens, gen.finish_reason) == (DEFAULT_MAX_TOKENS, "stop")


@pytest.mark.parametrize(
    ("endpoint", "body", "max_tokens", "finish"),
    [
        pytest.param(Endpoint.COMPLETIONS, completion(max_tokens=5), 5, "length", id="limit_set"),
        pytest.param(
            Endpoint.COMPLETIONS,
            completion(max_tokens=10**9),
            MAX_TOKENS_CAP,
            "length",
            id="above_cap_clamped",
        ),
        pytest.param(
            Endpoint.CHAT,
            chat(max_tokens=9, max_completion_tokens=3),
            3,
            "length",
            id="chat_max_completion_tokens_wins",
        ),
        pytest.param(
            Endpoint.COMPLETIONS,
            completion(max_completion_tokens=3),
            DEFAULT_MAX_TOKENS,
            "stop",
            id="completions_ignore_max_completion_tokens",
        ),
    ],
)
def test_parse_generation_output_limit(
    endpoint: Endpoint, body: dict[str, Any], max_tokens: int, finish: str
) -> None:
    gen = parse_generation(raw(body), endpoint, FAST)
    assert (gen.max_tokens, gen.finish_reason) == (max_tokens, finish)


def test_parse_generation_prompt_batch_times_n_choices() -> None:
    body = completion(["a b", "c", "d"], n=2)
    assert parse_generation(raw(body), Endpoint.COMPLETIONS, FAST).choices == 6


def test_parse_generation_stream_with_usage() -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    gen = parse_generation(raw(body), Endpoint.CHAT, FAST)
    assert (gen.stream, gen.include_usage) == (True, True)


@pytest.mark.parametrize(
    ("body", "inputs", "tokens"),
    [
        pytest.param({"input": prompt(3)}, (prompt(3),), 3, id="string"),
        pytest.param({"input": [prompt(2), prompt(5)]}, (prompt(2), prompt(5)), 7, id="strings"),
        pytest.param({"input": [7, 8, 9]}, ("7 8 9",), 3, id="token_ids"),
        pytest.param({"input": [[1, 2], [3]]}, ("1 2", "3"), 3, id="token_id_arrays"),
    ],
)
def test_parse_embedding_inputs_and_tokens(
    body: dict[str, Any], inputs: tuple[str, ...], tokens: int
) -> None:
    req = parse_embedding(raw({"model": MODEL, **body}), FAST)
    assert (req.inputs, req.prompt_tokens, req.base64) == (inputs, tokens, False)


def test_parse_embedding_conversation_is_one_input() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt(8)}]}
    req = parse_embedding(raw(body), FAST)
    assert len(req.inputs) == 1
    assert prompt(8) in req.inputs[0]
    assert req.prompt_tokens >= 8


def test_parse_embedding_base64() -> None:
    body = {"model": MODEL, "input": "x", "encoding_format": "base64"}
    assert parse_embedding(raw(body), FAST).base64


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        pytest.param({"mode": "clear"}, None, id="clear"),
        pytest.param({"mode": "hang"}, Fault("hang"), id="hang_once"),
        pytest.param(
            {"mode": "drop-mid-stream", "count": 3}, Fault("drop-mid-stream", 3), id="drop"
        ),
        pytest.param(
            {"mode": "status", "status": 429, "count": 2}, Fault("status", 2, 429), id="status"
        ),
    ],
)
def test_parse_fault(body: dict[str, Any], fault: Fault | None) -> None:
    assert parse_fault(raw(body)) == fault
