"""engine-sim over HTTP: OpenAI shapes, the cache end to end, errors, faults and disconnects.

Each test serves the app in-process on loopback (``serving``, the same runner the command
uses). Loops are bounded in count and time, and no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from router.core.blocks import CHARS_PER_TOKEN
from router.core.engine_model import EngineSpec
from router.enginesim.app import build_app
from router.enginesim.app_keys import REGISTRY
from router.enginesim.engine import SimSettings
from router.enginesim.faults import DROP_AFTER_TOKENS
from router.enginesim.requests import DEFAULT_MAX_TOKENS
from router.gateway.openai.sse import Decoder
from tests.enginesim.support import (
    ERROR_KEYS,
    FAST,
    MODEL,
    cached,
    chat,
    completion,
    engine,
    get_json,
    payloads,
    post,
    prompt,
    stream_events,
    wait_for_stats,
)

# -- response shapes ------------------------------------------------------------------------


async def test_chat_nonstream_vllm_shape() -> None:
    async with engine() as http:
        status, body = await post(http, "/v1/chat/completions", chat(max_tokens=5))
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 5
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_completions_nonstream_vllm_shape() -> None:
    async with engine() as http:
        status, body = await post(http, "/v1/completions", completion(prompt(3)))
    assert status == 200
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert len(choice["text"]) == DEFAULT_MAX_TOKENS * CHARS_PER_TOKEN
    assert choice["finish_reason"] == "stop"  # no limit was asked for
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_completions_prompt_batch_one_choice_per_prompt() -> None:
    async with engine() as http:
        _, body = await post(http, "/v1/completions", completion(["a b", "c"], max_tokens=2, n=2))
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2, 3]
    assert body["usage"]["completion_tokens"] == 8


async def test_chat_stream_role_tokens_finish_usage_done() -> None:
    body = chat(max_tokens=4, stream=True, stream_options={"include_usage": True})
    async with engine() as http:
        chunks = payloads(await stream_events(http, "/v1/chat/completions", body))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    role, *tokens, finish, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 4
    assert all(t["choices"][0]["finish_reason"] is None for t in tokens)
    text = "".join(t["choices"][0]["delta"]["content"] for t in tokens)
    assert len(text.split()) == 4
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_completions_stream_without_include_usage_no_usage_chunk() -> None:
    async with engine() as http:
        events = await stream_events(http, "/v1/completions", completion(max_tokens=3, stream=True))
    chunks = payloads(events)
    assert [c["object"] for c in chunks] == ["text_completion"] * 4
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all("usage" not in c for c in chunks)


async def test_timed_stream_all_tokens_then_done() -> None:
    spec = EngineSpec(prefill_tokens_per_s=1e6, decode_tokens_per_s=1e4)
    async with engine(SimSettings(spec=spec)) as http:
        events = await stream_events(
            http, "/v1/completions", completion(max_tokens=20, stream=True)
        )
        stats = await get_json(http, "/stats")
    assert len(payloads(events)) == 21
    assert stats["completion_tokens"] == 20
    assert stats["running"] == 0


async def test_embeddings_unit_vectors_one_per_input() -> None:
    body = {"model": MODEL, "input": [prompt(2), prompt(3, start=10)]}
    async with engine() as http:
        status, answer = await post(http, "/v1/embeddings", body)
        stats = await get_json(http, "/stats")
    assert status == 200
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(math.isclose(math.fsum(x * x for x in d["embedding"]), 1.0) for d in answer["data"])
    assert answer["usage"]["prompt_tokens"] == 5
    assert (stats["requests"], stats["prompt_tokens"], stats["cached_tokens"]) == (1, 5, 0)


async def test_models_lists_served_model() -> None:
    async with engine(SimSettings(model="m-1", fast=True)) as http:
        body = await get_json(http, "/v1/models")
    assert body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [("m-1", "model")]


# -- the prefix cache, end to end ---------------------------------------------------------


async def test_usage_cached_tokens_and_stats_then_reset() -> None:
    settings = SimSettings(spec=EngineSpec(block_tokens=4), fast=True)
    async with engine(settings) as http:
        _, first = await post(http, "/v1/completions", completion(prompt(40)))
        _, again = await post(http, "/v1/completions", completion(prompt(40)))
        stats = await get_json(http, "/stats")
        status, fresh = await post(http, "/reset", {})
        _, after_reset = await post(http, "/v1/completions", completion(prompt(40)))
    assert [cached(first), cached(again)] == [0, 39]
    assert (stats["requests"], stats["prompt_tokens"], stats["cached_tokens"]) == (2, 80, 39)
    assert status == 200
    assert (fresh["requests"], fresh["cached_tokens"], fresh["cache_tokens"]) == (0, 0, 0)
    assert cached(after_reset) == 0


async def test_usage_cached_tokens_in_stream_usage_event() -> None:
    body = chat(prompt(64), stream=True, stream_options={"include_usage": True})
    async with engine() as http:
        await stream_events(http, "/v1/chat/completions", body)
        usage = payloads(await stream_events(http, "/v1/chat/completions", body))[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 64


# -- metrics ------------------------------------------------------------------------------


async def test_metrics_route_serves_vllm_names() -> None:
    async with engine() as http:
        await post(http, "/v1/completions", completion(prompt(20)))
        async with http.get("/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:prefix_cache_queries_total"].value == 20
    assert samples["vllm:num_requests_running"].labels == {"model_name": MODEL}


def test_metrics_registry_owned_by_each_app() -> None:
    a, b = build_app(FAST), build_app(FAST)
    assert a[REGISTRY] is not b[REGISTRY]


# -- errors, in vLLM's dialect --------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "type_", "param"),
    [
        pytest.param("/v1/chat/completions", b"{bad", 400, "BadRequestError", None, id="json_400"),
        pytest.param(
            "/v1/completions",
            {**completion(), "model": "x"},
            404,
            "NotFoundError",
            "model",
            id="unknown_model_404",
        ),
        pytest.param(
            "/v1/chat/completions", chat(n=100), 400, "BadRequestError", "n", id="n_too_large_400"
        ),
        pytest.param(
            "/v1/embeddings", {"model": MODEL}, 400, "BadRequestError", "input", id="embed_400"
        ),
        pytest.param("/fault", {"mode": "x"}, 400, "BadRequestError", "mode", id="fault_400"),
    ],
)
async def test_bad_request_vllm_error_nothing_counted(
    path: str, body: Any, status: int, type_: str, param: str | None
) -> None:
    async with engine() as http:
        got, answer = await post(http, path, body)
        stats = await get_json(http, "/stats")
    assert got == status
    assert set(answer["error"]) == ERROR_KEYS
    assert (answer["error"]["type"], answer["error"]["code"]) == (type_, status)
    assert answer["error"]["param"] == param
    assert stats["requests"] == 0


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/v1/nothing", 404, id="unknown_path_404"),
        pytest.param("GET", "/v1/chat/completions", 405, id="wrong_method_405"),
    ],
)
async def test_routing_error_openai_error(method: str, path: str, status: int) -> None:
    async with engine() as http, http.request(method, path) as resp:
        answer = await resp.json()
    assert resp.status == status
    assert set(answer["error"]) == ERROR_KEYS
    assert answer["error"]["code"] == status


# -- faults -------------------------------------------------------------------------------


async def test_fault_status_next_n_requests_then_normal() -> None:
    async with engine() as http:
        status, armed = await post(http, "/fault", {"mode": "status", "status": 503, "count": 2})
        answers = [await post(http, "/v1/completions", completion()) for _ in range(3)]
        stats = await get_json(http, "/stats")
    assert (status, armed["fault"]) == (200, {"mode": "status", "count": 2, "status": 503})
    assert [s for s, _ in answers] == [503, 503, 200]
    assert set(answers[0][1]["error"]) == ERROR_KEYS
    assert answers[0][1]["error"]["code"] == 503
    assert answers[0][1]["error"]["type"] == "ServiceUnavailableError"
    assert stats["requests"] == 1


async def test_fault_every_other_request_count_times() -> None:
    async with engine() as http:
        fault = {"mode": "status", "status": 503, "count": 2, "every": 2}
        _, armed = await post(http, "/fault", fault)
        answers = [await post(http, "/v1/completions", completion()) for _ in range(6)]
    assert armed["fault"] == fault
    assert [s for s, _ in answers] == [200, 503, 200, 503, 200, 200]


async def post_with_timeout(http: aiohttp.ClientSession, body: Any, seconds: float) -> int:
    timeout = aiohttp.ClientTimeout(total=seconds)
    async with http.post("/v1/completions", json=body, timeout=timeout) as resp:
        return resp.status


async def test_fault_hang_sends_nothing_until_client_gives_up() -> None:
    async with engine() as http:
        await post(http, "/fault", {"mode": "hang"})
        with pytest.raises(asyncio.TimeoutError):
            await post_with_timeout(http, completion(), 0.3)
        status, _ = await post(http, "/v1/completions", completion())
        stats = await get_json(http, "/stats")
    assert status == 200
    assert (stats["requests"], stats["running"]) == (1, 0)


async def test_fault_drop_mid_stream_aborts_after_first_tokens() -> None:
    body = completion(max_tokens=50, stream=True)
    async with engine() as http:
        await post(http, "/fault", {"mode": "drop-mid-stream"})
        decoder, events = Decoder(), []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post("/v1/completions", json=body) as resp:
                assert resp.status == 200
                async for chunk in resp.content.iter_any():
                    events += decoder.feed(chunk)
        stats = await wait_for_stats(http, "running", 0)
        status, _ = await post(http, "/v1/completions", completion())
    assert len(events) == DROP_AFTER_TOKENS
    assert not any(e.done for e in events)
    assert stats["completion_tokens"] == DROP_AFTER_TOKENS
    assert status == 200


async def test_fault_drop_non_stream_truncates_body() -> None:
    async with engine() as http:
        await post(http, "/fault", {"mode": "drop-mid-stream"})
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post("/v1/chat/completions", json=chat()) as resp:
                await resp.read()
        await wait_for_stats(http, "running", 0)


async def test_fault_clear_drops_pending_fault() -> None:
    async with engine() as http:
        await post(http, "/fault", {"mode": "status", "status": 500, "count": 5})
        status, cleared = await post(http, "/fault", {"mode": "clear"})
        answer, _ = await post(http, "/v1/chat/completions", chat())
    assert (status, cleared, answer) == (200, {"fault": None}, 200)


# -- disconnects and sockets --------------------------------------------------------------


async def test_disconnect_mid_stream_running_back_to_zero() -> None:
    # 1000 tokens at 50 per second: the stream is still going when the client leaves.
    spec = EngineSpec(prefill_tokens_per_s=1e6, decode_tokens_per_s=50)
    async with engine(SimSettings(spec=spec)) as http:
        async with http.post("/v1/completions", json=completion(max_tokens=1000, stream=True)) as r:
            assert r.status == 200
            await r.content.readuntil(b"\n\n")
            during = await get_json(http, "/stats")
            r.close()
        after = await wait_for_stats(http, "running", 0)
    assert during["running"] == 1
    assert 0 < after["completion_tokens"] < 1000


async def test_accepted_socket_has_tcp_nodelay() -> None:
    async def nodelay(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        return web.json_response(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    app = build_app(FAST)
    app.router.add_get("/_nodelay", nodelay)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as http:
            value = await get_json(http, f"http://127.0.0.1:{port}/_nodelay")
    finally:
        await runner.cleanup()
    assert value != 0
