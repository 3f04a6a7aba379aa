"""The Responses and Messages routes through one exchange: pinning, keys, streams' ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from router.gateway.openai import sse
from tests.fakes import SSE, FakeEngine, Script
from tests.gateway.rig import TOKEN, A, B, rig

RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"


def stored(response_id: str) -> Script:
    body: dict[str, Any] = {"id": response_id, "object": "response", "output": [], "usage": None}
    return Script(chunks=[orjson.dumps(body)])


def named(kind: str, **obj: Any) -> bytes:
    return sse.encode(orjson.dumps({"type": kind, **obj}), kind)


def anthropic_stream(hang_after: int | None = None, drop_after: int | None = None) -> Script:
    usage = {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 0}
    chunks = [
        named("message_start", message={"id": "msg_1", "usage": usage}),
        named("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
        named("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        named("message_stop"),
    ]
    return Script(headers=dict(SSE), chunks=chunks, hang_after=hang_after, drop_after=drop_after)


def messages_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_previous_response_id_pins_the_engine_that_answered_it(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, ["m", "n"]), FakeEngine(B, ["m", "n"])) as r:
        r.up.next(stored("resp_1"))
        status, _ = await r.post(RESPONSES, {"model": "m", "input": "first " * 20})
        assert status == 200
        home = r.up.sent[-1]
        for i in range(6):  # prompts that would spread over both engines
            r.up.next(stored(f"resp_next_{i}"))
            body = {"model": "m", "input": f"other {i} " * 20, "previous_response_id": "resp_1"}
            status, _ = await r.post(RESPONSES, body)
            assert status == 200 and r.up.sent[-1] == home
        status, err = await r.post(
            RESPONSES, {"model": "m", "input": "x", "previous_response_id": "resp_unknown"}
        )
        assert status == 404
        assert err["error"]["param"] == "previous_response_id"
        assert err["error"]["code"] == "previous_response_not_found"


async def test_previous_response_on_an_engine_without_the_model_is_404(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, ["m"]), FakeEngine(B, ["m", "n"])) as r:
        for i in range(4):  # until engine A has answered one
            r.up.next(stored(f"resp_{i}"))
            await r.post(RESPONSES, {"model": "m", "input": f"turn {i} " * 20})
            if r.up.sent[-1] == A:
                break
        assert r.up.sent[-1] == A
        sent = len(r.up.sent)
        body = {"model": "n", "input": "x", "previous_response_id": f"resp_{i}"}
        status, err = await r.post(RESPONSES, body)
        assert status == 404 and err["error"]["param"] == "previous_response_id"
        assert len(r.up.sent) == sent  # nothing was sent anywhere


async def test_messages_x_api_key_is_the_clients_key_and_stays_here(tmp_path: Path) -> None:
    env = {"KVROUTER_API_KEYS": "team=k1"}
    async with rig(tmp_path, env=env) as r:
        status, err = await r.post(MESSAGES, messages_body(), headers={"x-api-key": "wrong"})
        assert status == 401
        assert err["type"] == "error" and err["error"]["type"] == "authentication_error"
        headers = {"x-api-key": "k1", "anthropic-version": "2023-06-01"}
        status, _ = await r.post(MESSAGES, messages_body(), headers=headers)
        assert status == 200
        (engine,) = [e for e in r.up.engines.values() if e.requests]
        sent = {k.lower(): v for k, v in engine.requests[-1].headers}
        assert "x-api-key" not in sent and sent["anthropic-version"] == "2023-06-01"


async def test_messages_stream_done_at_message_stop_counts_usage(tmp_path: Path) -> None:
    # The engine keeps its connection open after message_stop: the client has the whole answer
    # then, and the request is answered and its usage counted.
    async with rig(tmp_path) as r:
        r.up.next(anthropic_stream(hang_after=4))
        async with r.client.post(MESSAGES, json=messages_body(stream=True)) as resp:
            assert resp.status == 200
            events = sse.Decoder().feed(await resp.read())
        assert [e.event for e in events][-1] == "message_stop"
        assert await r.metric("kvrouter_requests_total", route=MESSAGES, code="200") == 1
        assert await r.metric("kvrouter_prompt_tokens_total") == 10
        assert await r.metric("kvrouter_cached_tokens_total") == 4


async def test_messages_stream_broken_ends_with_anthropics_error_event(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(anthropic_stream(drop_after=2))
        async with r.client.post(MESSAGES, json=messages_body(stream=True)) as resp:
            assert resp.status == 200
            events = sse.Decoder().feed(await resp.read())
        last = events[-1]
        assert last.event == "error"
        error = json.loads(last.data)
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert await r.metric("kvrouter_requests_total", route=MESSAGES, code="502") == 1


async def test_count_tokens_records_nothing_and_counts_no_usage(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(Script(chunks=[b'{"input_tokens": 12}']))
        status, got = await r.post("/v1/messages/count_tokens", messages_body())
        assert status == 200 and got == {"input_tokens": 12}
        assert r.gw.core.index.blocks(r.up.sent[-1]) == 0
        assert await r.metric("kvrouter_prompt_tokens_total") == 0


async def test_debug_route_reads_a_body_as_the_api_named(tmp_path: Path) -> None:
    system = "a long system prompt " * 10
    anthropic = messages_body(system=system)
    history = [{"role": "system", "content": system}, *anthropic["messages"]]
    chat = {"model": "m", "messages": history}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        _, as_chat = await r.post("/debug/route", chat, headers=auth)
        _, as_messages = await r.post("/debug/route?route=/v1/messages", anthropic, headers=auth)
        _, guessed = await r.post("/debug/route", anthropic, headers=auth)
    assert as_messages["blocks"] == as_chat["blocks"] > guessed["blocks"]  # system counted
