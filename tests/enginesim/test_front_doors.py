"""engine-sim's Responses and Messages routes: their shapes, events, usage and errors."""

from __future__ import annotations

import json
from typing import Any

from router.gateway.openai.sse import Event
from tests.enginesim.support import MODEL, engine, get_json, post, prompt, stream_events

LONG = prompt(200)


def responses(text: str = LONG, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, **extra}


def messages(text: str = LONG, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        **extra,
    }


def typed(events: list[Event]) -> list[dict[str, Any]]:
    """Each event's data, checked to name its own type in its ``event:`` line."""
    out = []
    for e in events:
        data = json.loads(e.data)
        assert e.event == data["type"], e
        out.append(data)
    return out


async def test_responses_body_usage_counts_the_cache() -> None:
    async with engine() as http:
        status, first = await post(http, "/v1/responses", responses(max_output_tokens=3))
        _, again = await post(http, "/v1/responses", responses())
    assert status == 200 and first["object"] == "response" and first["id"].startswith("resp_")
    assert first["status"] == "incomplete"  # it ran into max_output_tokens
    (item,) = first["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert len(item["content"][0]["text"].split()) == 3
    assert first["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert again["status"] == "completed"
    assert again["usage"]["input_tokens"] == first["usage"]["input_tokens"]
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_responses_stream_events_in_order_with_sequence_numbers() -> None:
    async with engine() as http:
        events = typed(await stream_events(http, "/v1/responses", responses(stream=True)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 16 and len(kinds) == 8 + len(deltas)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == "".join(deltas)
    assert done["id"] == events[0]["response"]["id"] and done["usage"]["input_tokens"] > 0


async def test_responses_previous_response_id_continues_the_stored_conversation() -> None:
    async with engine() as http:
        _, first = await post(http, "/v1/responses", responses(max_output_tokens=2))
        _, nxt = await post(
            http, "/v1/responses", responses("and then?", previous_response_id=first["id"])
        )
        status, missing = await post(
            http, "/v1/responses", responses("x", previous_response_id="resp_nope")
        )
    # The stored turns come first: the whole first prompt is the continuation's cached start.
    assert nxt["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    assert nxt["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert status == 404 and missing["error"]["param"] == "previous_response_id"


async def test_messages_body_and_stream_in_anthropics_shapes() -> None:
    async with engine() as http:
        status, body = await post(http, "/v1/messages", messages())
        events = typed(await stream_events(http, "/v1/messages", messages(stream=True)))
    assert status == 200 and body["type"] == "message" and body["role"] == "assistant"
    assert body["stop_reason"] == "max_tokens" and body["content"][0]["type"] == "text"
    assert body["usage"]["cache_read_input_tokens"] == 0
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert len(deltas) == 4
    start = events[0]["message"]["usage"]
    # Anthropic counts the cached tokens apart from the input tokens.
    assert start["cache_read_input_tokens"] > 0
    assert (
        start["input_tokens"] + start["cache_read_input_tokens"] == (body["usage"]["input_tokens"])
    )
    assert events[-2]["usage"]["output_tokens"] == 4


async def test_count_tokens_counts_without_generating() -> None:
    async with engine() as http:
        status, got = await post(http, "/v1/messages/count_tokens", messages())
        _, body = await post(http, "/v1/messages", messages())
        stats = await get_json(http, "/stats")
    assert status == 200 and got == {"input_tokens": body["usage"]["input_tokens"]}
    assert stats["requests"] == 1


async def test_messages_errors_in_anthropics_shape() -> None:
    async with engine() as http:
        cases = [
            ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400),  # no max
            (messages(model="other"), 404),
            ({"model": MODEL, "max_tokens": 2, "messages": [{"role": 1}]}, 400),
        ]
        for body, want in cases:
            status, error = await post(http, "/v1/messages", body)
            assert status == want
            assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        status, error = await post(http, "/v1/messages", b"{not json")
    assert status == 400 and error["error"]["type"] == "invalid_request_error"
