"""The proxy's pure helpers: header filtering, ``usage`` reading, the stream's usage tail."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from router.gateway.openai import sse
from router.gateway.upstream.headers import (
    UsageTail,
    client_headers,
    engine_headers,
    response_id,
    usage_counts,
)


def event(obj: Any, eol: bytes = b"\n") -> bytes:
    return b"data: " + orjson.dumps(obj) + eol + eol


def usage(prompt: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}


def stream(n_tokens: int = 5, final: dict[str, Any] | None = None, eol: bytes = b"\n") -> bytes:
    parts = [
        event({"choices": [{"delta": {"content": f"t{i}"}}], "usage": None}, eol)
        for i in range(n_tokens)
    ]
    if final is not None:
        parts.append(event({"choices": [], "usage": final}, eol))
    parts.append(b"data: [DONE]" + eol + eol)
    return b"".join(parts)


def tail_of(data: bytes, cuts: list[int], keep: int = 16384) -> UsageTail:
    t = UsageTail(keep)
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            t.feed(data[a:b])
    return t


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_usage_tail_final_usage_event_found(eol: bytes) -> None:
    assert tail_of(stream(final=usage(120, 96), eol=eol), []).usage() == (120, 96)


def test_usage_tail_none_without_usage_event() -> None:
    assert tail_of(stream(final=None), []).usage() is None


def test_usage_tail_last_of_continuous_usage_wins() -> None:
    data = event({"usage": usage(10, 0)}) + event({"usage": usage(10, 8)}) + sse.DONE
    assert tail_of(data, []).usage() == (10, 8)


def test_usage_tail_long_stream_keeps_only_the_end() -> None:
    data = stream(n_tokens=2000, final=usage(7, 3))
    t = tail_of(data, list(range(0, len(data), 97)), keep=4096)
    assert t.usage() == (7, 3)


def test_usage_tail_cut_inside_usage_event_gives_up() -> None:
    big = {"choices": [], "usage": usage(7, 3), "pad": "x" * 5000}
    data = event({"choices": []}) + event(big) + sse.DONE
    assert tail_of(data, list(range(0, len(data), 100)), keep=1000).usage() is None


def test_usage_tail_usage_object_whole_in_a_cut_event_is_read() -> None:
    # Only the usage object has to be whole: a Responses stream's last event carries the
    # whole response, and may be longer than the tail.
    big = {"choices": [], "pad": "x" * 5000, "usage": usage(7, 3)}
    data = event({"choices": []}) + event(big) + sse.DONE
    assert tail_of(data, list(range(0, len(data), 100)), keep=1000).usage() == (7, 3)


def test_usage_tail_quoted_usage_in_content_ignored() -> None:
    data = event({"choices": [{"delta": {"content": 'say "usage" now'}}]}) + sse.DONE
    assert tail_of(data, []).usage() is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_usage_tail_any_chunking_same_answer(cuts: list[int]) -> None:
    data = stream(n_tokens=12, final=usage(300, 256))
    assert tail_of(data, cuts).usage() == (300, 256)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (usage(10, 4), (10, 4)),
        ({"prompt_tokens": 10}, None),
        ({"prompt_tokens": 10, "prompt_tokens_details": None}, None),
        ({"prompt_tokens": True, "prompt_tokens_details": {"cached_tokens": 1}}, None),
        ({"prompt_tokens": -1, "prompt_tokens_details": {"cached_tokens": 0}}, None),
        (None, None),
        ("usage", None),
        ({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}}, (10, 4)),
        ({"input_tokens": 10, "input_tokens_details": {}}, None),
        # Anthropic counts cached tokens apart from the input: the prompt is their sum.
        ({"input_tokens": 6, "cache_read_input_tokens": 4}, (10, 4)),
        ({"input_tokens": 6, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 2},
         (12, 4)),
        ({"input_tokens": 6, "cache_read_input_tokens": None}, None),
        ({"output_tokens": 3}, None),
    ],
)  # fmt: skip
def test_usage_counts_needs_both_figures(value: Any, expected: tuple[int, int] | None) -> None:
    assert usage_counts(value) == expected


def test_engine_headers_no_forwarded_for_without_peer_or_chain() -> None:
    got = dict(engine_headers(CIMultiDict({"Content-Type": "application/json"}), None))
    assert got == {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def test_engine_headers_forwarded_for_chain_joined_behind_a_trusted_proxy() -> None:
    h = CIMultiDict([("X-Forwarded-For", "1.1.1.1"), ("X-Forwarded-For", "2.2.2.2")])
    got = dict(engine_headers(h, "10.0.0.9", trust_forwarding=True))
    assert got["X-Forwarded-For"] == "1.1.1.1, 2.2.2.2, 10.0.0.9"


CLIENT = CIMultiDict(
    [
        ("Authorization", "Bearer sk-client"),
        ("Cookie", "session=1"),
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Real-IP", "6.6.6.6"),
        ("Forwarded", "for=6.6.6.6"),
        ("X-Forwarded-Host", "evil"),
        ("Content-Type", "application/json"),
    ]
)


def test_engine_headers_default_strips_client_credentials_and_spoofable_forwarding() -> None:
    got = dict(engine_headers(CLIENT, "10.0.0.9"))
    assert got == {
        "Content-Type": "application/json",
        "X-Forwarded-For": "10.0.0.9",  # the peer the gateway saw, nothing the client wrote
        "Accept-Encoding": "identity",
    }


def test_engine_headers_configured_to_pass_them() -> None:
    got = dict(engine_headers(CLIENT, "10.0.0.9", pass_credentials=True, trust_forwarding=True))
    assert got["Authorization"] == "Bearer sk-client" and got["Cookie"] == "session=1"
    assert got["X-Real-IP"] == "6.6.6.6" and got["Forwarded"] == "for=6.6.6.6"
    assert got["X-Forwarded-For"] == "6.6.6.6, 10.0.0.9"


TRACED = CIMultiDict(
    [
        ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("TraceState", "vendor=opaque"),
        ("Content-Type", "application/json"),
    ]
)


def test_engine_headers_pass_the_client_trace_context_unless_the_router_traces() -> None:
    passed = engine_headers(TRACED, None)
    assert [(k, v) for k, v in passed if k.lower() in ("traceparent", "tracestate")] == [
        *TRACED.items()
    ][:2]
    own = dict(engine_headers(TRACED, None, own_trace_context=True))
    assert own == {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def test_client_headers_drop_hop_by_hop_and_length() -> None:
    h = CIMultiDict(
        {
            "Content-Type": "text/event-stream",
            "Content-Length": "10",
            "Transfer-Encoding": "chunked",
            "Connection": "close, X-Hop",
            "X-Hop": "1",
            "X-Request-Id": "r1",
        }
    )
    got = client_headers(h)
    assert dict(got) == {"Content-Type": "text/event-stream", "X-Request-Id": "r1"}


def test_client_headers_repeated_kept() -> None:
    h = CIMultiDict([("Cache-Control", "no-cache"), ("Cache-Control", "no-store")])
    assert client_headers(h).getall("Cache-Control") == ["no-cache", "no-store"]


def test_client_headers_only_the_allowed_leave() -> None:
    h = CIMultiDict(
        [
            ("Content-Type", "application/json"),
            ("Retry-After", "3"),
            ("x-ratelimit-remaining-requests", "9"),
            ("Set-Cookie", "engine-session=abc"),
            ("X-Internal-Node", "gpu-17.cluster.local"),
            ("Server", "uvicorn"),
            ("X-Powered-By", "vllm 0.32"),
        ]
    )
    assert dict(client_headers(h)) == {
        "Content-Type": "application/json",
        "Retry-After": "3",
        "x-ratelimit-remaining-requests": "9",
    }


def test_engine_headers_keep_anthropics_x_api_key_and_pass_its_version() -> None:
    h = CIMultiDict([("x-api-key", "sk-client"), ("anthropic-version", "2023-06-01")])
    got = dict(engine_headers(h, None))
    assert "x-api-key" not in got and got["anthropic-version"] == "2023-06-01"
    assert dict(engine_headers(h, None, pass_credentials=True))["x-api-key"] == "sk-client"


def named(kind: str, obj: Any) -> bytes:
    return sse.encode(orjson.dumps({"type": kind, **obj}), kind)


def test_usage_tail_responses_completed_event() -> None:
    u = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 2}
    data = b"".join(
        [
            named("response.created", {"response": {"id": "resp_1", "usage": None}}),
            named("response.output_text.delta", {"delta": "hi"}),
            named("response.completed", {"response": {"id": "resp_1", "usage": u}}),
        ]
    )
    assert tail_of(data, []).usage() == (30, 20)


def test_usage_tail_anthropic_input_from_message_start_when_the_tail_lost_it() -> None:
    start = {"usage": {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 0}}
    deltas = [named("content_block_delta", {"delta": {"text": "w" * 50}}) for _ in range(400)]
    data = b"".join(
        [
            named("message_start", {"message": start}),
            *deltas,
            named("message_delta", {"usage": {"output_tokens": 400}}),
            named("message_stop", {}),
        ]
    )
    assert tail_of(data, [], keep=1024).usage() == (10, 4)  # from the kept first chunk
    assert tail_of(data, [7, 60, 900, 5000], keep=1024).usage() == (10, 4)  # in pieces
    small = list(range(0, len(data), 50))
    assert tail_of(data, small, keep=100).usage() is None  # longer than what is kept
    whole = data.replace(
        b'{"output_tokens":400}', b'{"input_tokens":6,"cache_read_input_tokens":5}'
    )
    assert tail_of(whole, [], keep=1024).usage() == (11, 5)  # a full message_delta wins


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (b'{"id":"resp_1","object":"response","output":[{"id":"msg_2"}]}', "resp_1"),
        (named("response.created", {"sequence_number": 0, "response": {"id": "resp_3"}}),
         "resp_3"),
        (b'{"object": "response", "id" : "resp_4"}', "resp_4"),
        (b'{"error": {"message": "no"}}', None),
        (b"", None),
    ],
)  # fmt: skip
def test_response_id_from_the_answers_first_bytes(first: bytes, expected: str | None) -> None:
    assert response_id(first) == expected
