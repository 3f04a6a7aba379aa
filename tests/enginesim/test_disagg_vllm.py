"""engine-sim speaking vLLM's disaggregation: a prefill engine's kv_transfer_params, a decode
engine's pull, and their failures; real processes on loopback, driven the way vLLM's toy proxy
drives them."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.core.disaggregation import DEFAULT_KV_BYTES_PER_TOKEN
from tests.enginesim.pd_support import (
    BLOCK_TOKENS,
    post,
    start_engine,
    stats,
    transfer_seconds,
    vllm_decode_body,
    vllm_prefill_body,
)
from tests.enginesim.support import ERROR_KEYS, MODEL, chat, prompt
from tests.support import Proc, eventually, free_port, running

pytestmark = pytest.mark.integration

PROMPT_TOKENS = 200


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    tmp: Path = tmp_path_factory.mktemp("pd-vllm")
    with running([]) as procs:
        engines = {
            "prefill": start_engine(tmp, "vllm", "prefill"),
            "decode": start_engine(tmp, "vllm", "decode"),
            "recompute": start_engine(tmp, "vllm", "decode", "--kv-load-failure", "recompute"),
            "brief": start_engine(tmp, "vllm", "prefill", "--transfer-timeout", "0.3"),
        }
        procs.extend(engines.values())
        yield engines


@pytest.fixture
async def http(fleet: dict[str, Proc]) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        for proc in fleet.values():
            async with session.post(f"{proc.url}/reset") as resp:
                assert resp.status == 200
        yield session


def client_body(start: int, **extra: Any) -> dict[str, Any]:
    return chat(prompt(PROMPT_TOKENS, start), max_tokens=5, **extra)


async def prefilled(
    http: aiohttp.ClientSession, proc: Proc, client: dict[str, Any], rid: str
) -> dict[str, Any]:
    status, answer = await post(http, proc, vllm_prefill_body(client), {"X-Request-Id": rid})
    assert status == 200, answer
    return dict(answer)


async def test_prefill_answers_where_its_blocks_wait(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    answer = await prefilled(http, fleet["prefill"], client_body(0), "p-1")
    params = answer["kv_transfer_params"]
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == 1
    assert answer["choices"][0]["finish_reason"] == "length"
    assert list(params) == [
        "do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
        "remote_request_id", "remote_host", "remote_port", "tp_size",
    ]  # fmt: skip
    assert (params["do_remote_prefill"], params["do_remote_decode"], params["tp_size"]) == (
        True,
        False,
        1,
    )
    assert len(params["remote_block_ids"]) == math.ceil(prompt_tokens / BLOCK_TOKENS)
    assert f"http://{params['remote_host']}:{params['remote_port']}" == fleet["prefill"].url
    got = await stats(http, fleet["prefill"])
    assert params["remote_engine_id"] == got["engine_id"]
    assert (got["prefilled_for_remote"], got["kv_held"], got["role"]) == (1, 1, "prefill")


async def test_decode_pulls_the_prompt_then_decodes_nonstreamed(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(1)
    answer = await prefilled(http, fleet["prefill"], client, "r-2")
    body = vllm_decode_body(client, answer)
    status, out = await post(http, fleet["decode"], body, {"X-Request-Id": "r-2"})
    assert status == 200, out
    assert "kv_transfer_params" not in out
    assert out["usage"]["completion_tokens"] == 5
    tokens = out["usage"]["prompt_tokens"]
    got = await stats(http, fleet["decode"])
    # A cold decode engine lacks every token but none it computes: all come over the link.
    assert (got["decoded_from_remote"], got["transferred_tokens"]) == (1, tokens)
    assert got["transferred_bytes"] == tokens * DEFAULT_KV_BYTES_PER_TOKEN
    assert got["transfer_seconds"] == pytest.approx(transfer_seconds(tokens))
    assert (await stats(http, fleet["prefill"]))["kv_held"] == 0  # released once pulled


async def test_decode_stream_with_openai_client_waits_the_transfer(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(2, stream=True, stream_options={"include_usage": True})
    answer = await prefilled(http, fleet["prefill"], client, "r-3")
    params = answer["kv_transfer_params"]
    async with openai.AsyncOpenAI(
        base_url=f"{fleet['decode'].url}/v1", api_key="x", max_retries=0, timeout=20
    ) as oa:
        sent = time.monotonic()
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=client["messages"],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"kv_transfer_params": params},
            extra_headers={"X-Request-Id": "r-3"},
        )
        first: float | None = None
        text = ""
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
    assert usage is not None and len(text.split()) == 5
    got = await stats(http, fleet["decode"])
    assert got["transfer_seconds"] == pytest.approx(transfer_seconds(usage.prompt_tokens))
    # The transfer is slept before the first token: a lower bound, whatever the machine.
    assert first is not None and first - sent >= got["transfer_seconds"] * 0.99


async def test_decode_holds_the_transferred_blocks(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(3)
    answer = await prefilled(http, fleet["prefill"], client, "r-4")
    assert (await post(http, fleet["decode"], vllm_decode_body(client, answer)))[0] == 200
    # The same conversation again, run whole: the decode engine's cache has it.
    status, out = await post(http, fleet["decode"], client)
    assert status == 200
    tokens = out["usage"]["prompt_tokens"]
    full = (tokens // BLOCK_TOKENS) * BLOCK_TOKENS
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == min(full, tokens - 1)
    # A follow-up turn split again pulls only the tokens the decode engine lacks.
    longer = chat(prompt(PROMPT_TOKENS, 3) + prompt(40, 900), max_tokens=5)
    answer = await prefilled(http, fleet["prefill"], longer, "r-5")
    before = (await stats(http, fleet["decode"]))["transferred_tokens"]
    status, out = await post(http, fleet["decode"], vllm_decode_body(longer, answer))
    assert status == 200
    got = await stats(http, fleet["decode"])
    moved = got["transferred_tokens"] - before
    assert (
        moved
        == out["usage"]["prompt_tokens"] - out["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert 0 < moved < out["usage"]["prompt_tokens"] - full + BLOCK_TOKENS
    assert (got["decoded_from_remote"], got["whole"]) == (2, 1)


async def test_dead_prefill_engine_fails_the_decode_request(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(4)
    answer = await prefilled(http, fleet["prefill"], client, "r-6")
    answer["kv_transfer_params"]["remote_port"] = free_port()  # nothing listens there
    status, out = await post(http, fleet["decode"], vllm_decode_body(client, answer))
    assert status == 500 and set(out["error"]) == ERROR_KEYS
    assert "KV transfer" in out["error"]["message"]
    got = await stats(http, fleet["decode"])
    assert (got["transfer_failures"], got["decoded_from_remote"], got["requests"]) == (1, 0, 0)


async def test_recompute_policy_prefills_what_it_cannot_pull(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(5)
    answer = await prefilled(http, fleet["prefill"], client, "r-7")
    answer["kv_transfer_params"]["remote_port"] = free_port()
    status, out = await post(http, fleet["recompute"], vllm_decode_body(client, answer))
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    got = await stats(http, fleet["recompute"])
    assert (got["transfer_failures"], got["whole"], got["transferred_tokens"]) == (1, 1, 0)


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [("remote_engine_id", "another-engine", 400), ("remote_request_id", "never-seen", 404)],
)
async def test_unknown_remote_fails_the_decode_request(
    http: aiohttp.ClientSession, fleet: dict[str, Proc], field: str, value: str, status: int
) -> None:
    client = client_body(6)
    answer = await prefilled(http, fleet["prefill"], client, "r-8")
    answer["kv_transfer_params"][field] = value
    got_status, out = await post(http, fleet["decode"], vllm_decode_body(client, answer))
    assert got_status == 500
    assert f"failed: {status} " in out["error"]["message"]
    assert (await stats(http, fleet["prefill"]))["kv_held"] == 1  # still there for its owner


async def test_unpulled_blocks_are_released_after_the_timeout(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(7)
    answer = await prefilled(http, fleet["brief"], client, "r-9")

    async def expired() -> dict[str, Any]:
        got = await stats(http, fleet["brief"])
        assert (got["kv_held"], got["kv_expired"]) == (0, 1)
        return got

    await eventually(expired, timeout=10)
    status, out = await post(http, fleet["decode"], vllm_decode_body(client, answer))
    assert status == 500 and "no KV is held" in out["error"]["message"]


async def test_plain_requests_run_whole_on_either_role(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    for role in ("prefill", "decode"):
        status, out = await post(http, fleet[role], client_body(8))
        assert status == 200 and out["usage"]["completion_tokens"] == 5
        assert "kv_transfer_params" not in out
        got = await stats(http, fleet[role])
        assert (got["whole"], got["prefilled_for_remote"], got["decoded_from_remote"]) == (1, 0, 0)


async def test_incomplete_remote_params_run_whole(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    body = client_body(9, kv_transfer_params={"do_remote_prefill": True})
    status, out = await post(http, fleet["decode"], body)
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    got = await stats(http, fleet["decode"])
    assert (got["whole"], got["transfer_failures"]) == (1, 0)


async def test_kv_transfer_params_not_an_object_is_400(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    status, out = await post(http, fleet["decode"], client_body(0, kv_transfer_params=[1]))
    assert status == 400 and out["error"]["param"] == "kv_transfer_params"
    assert (await stats(http, fleet["decode"]))["requests"] == 0


async def test_metrics_count_paths_and_transfers(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(10)
    answer = await prefilled(http, fleet["prefill"], client, "r-10")
    assert (await post(http, fleet["decode"], vllm_decode_body(client, answer)))[0] == 200
    got = await stats(http, fleet["decode"])
    async with http.get(f"{fleet['decode'].url}/metrics") as resp:
        text = await resp.text()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("enginesim:"))
    labels = f'model_name="{MODEL}"'
    assert float(lines[f'enginesim:pd_requests_total{{{labels},path="decoded-from-remote"}}']) == 1
    assert (
        float(lines[f"enginesim:kv_transfer_tokens_total{{{labels}}}"])
        == (got["transferred_tokens"])
    )
    assert float(lines[f"enginesim:kv_transfer_seconds_total{{{labels}}}"]) == pytest.approx(
        got["transfer_seconds"]
    )
    assert float(lines['enginesim:role_info{role="decode"}']) == 1
