"""kvrouter engine-sim: OpenAI shapes, the prefix cache, metrics, faults and disconnects.

Most tests serve the app in-process on loopback (``serving``, the same runner the command
uses); the ones marked ``integration`` start the real command. Loops are bounded in count and
time, and no test asserts on how long anything took.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from router.core.engine_model import EngineSpec
from router.enginesim import app as engine_sim
from router.enginesim.app import DEFAULT_MODEL, SimSettings, build_app, serving
from router.gateway.sse import Decoder, Event
from tests.support import Proc, running, start_kvrouter

MODEL = DEFAULT_MODEL
FAST = SimSettings(fast=True)
ERROR_KEYS = {"message", "type", "param", "code"}


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def chat(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def completion(prompt: Any = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **extra}


@asynccontextmanager
async def engine(settings: SimSettings = FAST) -> AsyncIterator[aiohttp.ClientSession]:
    """An in-process engine and a client session whose relative URLs point at it."""
    async with serving(settings) as url, aiohttp.ClientSession(url) as http:
        yield http


async def post(http: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(path, data=data) as resp:
        return resp.status, await resp.json(content_type=None)


async def get_json(http: aiohttp.ClientSession, path: str) -> Any:
    async with http.get(path) as resp:
        assert resp.status == 200
        return await resp.json()


async def stream_events(http: aiohttp.ClientSession, path: str, body: Any) -> list[Event]:
    async with http.post(path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        decoder = Decoder()
        events = [e async for chunk in resp.content.iter_any() for e in decoder.feed(chunk)]
        assert not decoder.pending
        return events


async def wait_for_stats(
    http: aiohttp.ClientSession, key: str, value: int, limit_s: float = 10.0
) -> dict[str, Any]:
    """Poll /stats until ``key`` equals ``value`` (bounded); return the last stats."""
    for _ in range(int(limit_s / 0.02)):
        stats: dict[str, Any] = await get_json(http, "/stats")
        if stats[key] == value:
            return stats
        await asyncio.sleep(0.02)
    raise AssertionError(f"/stats {key} never became {value}: {stats}")


def payloads(events: list[Event]) -> list[dict[str, Any]]:
    assert events[-1].done
    return [json.loads(e.data) for e in events[:-1]]


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
        status, body = await post(http, "/v1/completions", completion(words(3)))
    assert status == 200
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert len(choice["text"].split()) == engine_sim.DEFAULT_MAX_TOKENS
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


async def test_embeddings_deterministic_unit_vectors_float_and_base64() -> None:
    body = {"model": MODEL, "input": ["same text", "other", "same text"]}
    async with engine() as http:
        status, floats = await post(http, "/v1/embeddings", body)
        _, packed = await post(http, "/v1/embeddings", {**body, "encoding_format": "base64"})
    assert status == 200
    vectors = [d["embedding"] for d in floats["data"]]
    assert vectors[0] == vectors[2] != vectors[1]
    assert math.isclose(math.fsum(x * x for x in vectors[0]), 1.0)
    raw = base64.b64decode(packed["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(vectors[0], abs=1e-6)
    assert floats["usage"]["prompt_tokens"] == 5


async def test_models_lists_served_model() -> None:
    async with engine(SimSettings(model="m-1", fast=True)) as http:
        body = await get_json(http, "/v1/models")
    assert body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [("m-1", "model")]


# -- prefix cache -------------------------------------------------------------------------


def cached(body: dict[str, Any]) -> int:
    value: int = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return value


async def test_cached_tokens_grow_on_repeated_prefix_zero_after_reset() -> None:
    settings = SimSettings(spec=EngineSpec(block_tokens=4), fast=True)
    async with engine(settings) as http:
        _, first = await post(http, "/v1/completions", completion(words(40)))
        _, again = await post(http, "/v1/completions", completion(words(40)))
        _, longer = await post(http, "/v1/completions", completion(words(50)))
        stats = await get_json(http, "/stats")
        status, _ = await post(http, "/reset", {})
        _, after_reset = await post(http, "/v1/completions", completion(words(40)))
        stats_after = await get_json(http, "/stats")
    assert [cached(first), cached(again), cached(longer)] == [0, 39, 40]
    assert (stats["requests"], stats["prompt_tokens"], stats["cached_tokens"]) == (3, 130, 79)
    assert status == 200
    assert cached(after_reset) == 0
    assert (stats_after["requests"], stats_after["cached_tokens"]) == (1, 0)


async def test_cached_tokens_chat_history_prefix_reused() -> None:
    settings = SimSettings(spec=EngineSpec(block_tokens=4), fast=True)
    turn1 = [{"role": "system", "content": words(30)}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
    async with engine(settings) as http:
        await post(http, "/v1/chat/completions", {"model": MODEL, "messages": turn1})
        _, body = await post(http, "/v1/chat/completions", {"model": MODEL, "messages": turn2})
    assert cached(body) >= 32


async def test_token_id_prompt_counts_ids_as_tokens() -> None:
    async with engine() as http:
        _, first = await post(http, "/v1/completions", completion(list(range(40))))
        _, again = await post(http, "/v1/completions", completion(list(range(40))))
    assert first["usage"]["prompt_tokens"] == 40
    assert cached(again) == 32  # two full blocks of 16


async def test_lru_eviction_when_capacity_exceeded() -> None:
    # Eight blocks of four tokens: three 16-token prompts do not fit together.
    settings = SimSettings(spec=EngineSpec(capacity_tokens=32, block_tokens=4), fast=True)
    a, b, c = (completion(words(16, start)) for start in (0, 100, 200))
    async with engine(settings) as http:
        for body in (a, b, c):
            await post(http, "/v1/completions", body)
        _, c_again = await post(http, "/v1/completions", c)
        _, a_again = await post(http, "/v1/completions", a)
        stats = await get_json(http, "/stats")
    assert cached(c_again) == 15
    assert cached(a_again) == 0
    assert stats["cache_tokens"] <= 32


async def test_models_namespaces_do_not_share_cache() -> None:
    # The same words under another served model name are a different prefix.
    async with engine(SimSettings(model="m-a", fast=True)) as http:
        _, body = await post(http, "/v1/completions", {"model": "m-a", "prompt": words(40)})
    assert cached(body) == 0


# -- metrics ------------------------------------------------------------------------------


async def test_metrics_vllm_names_with_model_label() -> None:
    async with engine(SimSettings(spec=EngineSpec(block_tokens=4), fast=True)) as http:
        for _ in range(2):
            await post(http, "/v1/completions", completion(words(20)))
        async with http.get("/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    samples = {
        s.name: s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:")
    }
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert samples[name].labels == {"model_name": MODEL}, name
    assert samples["vllm:prefix_cache_queries_total"].value == 40
    assert samples["vllm:prefix_cache_hits_total"].value == 19
    assert samples["vllm:num_requests_running"].value == 0
    assert 0 < samples["vllm:kv_cache_usage_perc"].value <= 1


def test_metrics_registry_owned_by_each_app() -> None:
    a, b = build_app(FAST), build_app(FAST)
    assert a[engine_sim.REGISTRY] is not b[engine_sim.REGISTRY]


# -- bad input ----------------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param("/v1/chat/completions", b"{bad", 400, None, id="malformed_json_400"),
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
    pytest.param("/fault", {"mode": "explode"}, 400, "mode", id="fault_unknown_mode_400"),
    pytest.param(
        "/fault", {"mode": "status", "status": 200}, 400, "status", id="fault_status_not_error_400"
    ),
    pytest.param("/fault", {"mode": "hang", "count": 0}, 400, "count", id="fault_count_zero_400"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
async def test_bad_request_openai_error(
    path: str, body: Any, status: int, param: str | None
) -> None:
    async with engine() as http:
        got, answer = await post(http, path, body)
        stats = await get_json(http, "/stats")
    assert got == status
    assert set(answer["error"]) == ERROR_KEYS
    assert answer["error"]["code"] == status
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


async def test_max_tokens_above_cap_clamped() -> None:
    async with engine() as http:
        _, body = await post(http, "/v1/completions", completion(max_tokens=10**9))
    assert body["usage"]["completion_tokens"] == engine_sim.MAX_TOKENS_CAP


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
    assert stats["requests"] == 1


async def test_fault_hang_sends_nothing_until_client_gives_up() -> None:
    async with engine() as http:
        await post(http, "/fault", {"mode": "hang"})
        with pytest.raises(asyncio.TimeoutError):
            await post_with_timeout(http, completion(), 0.3)
        status, _ = await post(http, "/v1/completions", completion())
        stats = await get_json(http, "/stats")
    assert status == 200
    assert (stats["requests"], stats["running"]) == (1, 0)


async def post_with_timeout(http: aiohttp.ClientSession, body: Any, seconds: float) -> int:
    timeout = aiohttp.ClientTimeout(total=seconds)
    async with http.post("/v1/completions", json=body, timeout=timeout) as resp:
        return resp.status


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
    assert len(events) == engine_sim.DROP_AFTER_TOKENS
    assert not any(e.done for e in events)
    assert stats["completion_tokens"] == engine_sim.DROP_AFTER_TOKENS
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


# -- command line -------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    engine_sim.add_arguments(parser)
    return parser.parse_args(["--port", "0", *argv])


def test_arguments_default_to_engine_spec() -> None:
    settings = engine_sim.settings_from_args(parse())
    assert settings == SimSettings(model=DEFAULT_MODEL, spec=EngineSpec(), fast=False)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--block-tokens", "0"], id="block_tokens_zero_exit_2"),
        pytest.param(["--decode-tokens-per-s", "-1"], id="negative_rate_exit_2"),
        pytest.param(["--max-batch", "many"], id="max_batch_not_a_number_exit_2"),
    ],
)
def test_arguments_invalid_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


def test_run_capacity_below_one_block_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_sim.run(parse("--kv-capacity-tokens", "8", "--block-tokens", "16")) == 2
    assert "capacity_tokens" in capsys.readouterr().err


# -- the real command, with the official client -------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("engine-sim")
    with running([]) as procs:
        procs.append(start_kvrouter(["engine-sim", "--fast", "--block-tokens", "4"], tmp))
        yield procs[0]


@pytest.fixture
def client(sim: Proc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, timeout=10) as c:
        yield c


@pytest.mark.integration
def test_openai_client_chat_nonstream_accepted(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": words(12)}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert first.choices[0].message.content
    assert first.usage is not None and again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 12


@pytest.mark.integration
def test_openai_client_chat_stream_include_usage_accepted(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 4
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


@pytest.mark.integration
def test_openai_client_completions_stream_and_nonstream_accepted(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="a b c", max_tokens=2)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="a b c",
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(full.choices[0].text.split()) == 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 3


@pytest.mark.integration
def test_openai_client_embeddings_and_models_accepted(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model=MODEL, input=["a", "b"])
    assert [len(d.embedding) for d in result.data] == [engine_sim.EMBEDDING_DIM] * 2
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.mark.integration
def test_openai_client_unknown_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt="x")
    assert exc.value.status_code == 404


@pytest.mark.integration
def test_openai_client_injected_503_service_unavailable(sim: Proc, client: openai.OpenAI) -> None:
    with openai.OpenAI(base_url=sim.url, api_key="x", max_retries=0) as admin:
        admin.post("/fault", body={"mode": "status", "status": 503}, cast_to=object)
    with pytest.raises(openai.InternalServerError) as exc:
        client.completions.create(model=MODEL, prompt="x")
    assert exc.value.status_code == 503


@pytest.mark.integration
async def test_process_disconnect_running_back_to_zero_then_sigterm_exit_0(
    procs: list[Proc], tmp_path: Path
) -> None:
    args = ["engine-sim", "--decode-tokens-per-s", "50", "--prefill-tokens-per-s", "1e6"]
    proc = start_kvrouter(args, tmp_path)
    procs.append(proc)
    async with aiohttp.ClientSession(proc.url) as http:
        body = chat(max_tokens=1000, stream=True)
        async with http.post("/v1/chat/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            assert (await get_json(http, "/stats"))["running"] == 1
            resp.close()
        await wait_for_stats(http, "running", 0)
    assert proc.stop() == 0
