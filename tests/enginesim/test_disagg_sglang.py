"""engine-sim speaking SGLang's disaggregation: both sides of a bootstrap room, the transfer, a
side that never comes, aborts; real processes on loopback, sent the body SGLang's mini load
balancer sends to both engines at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.enginesim.pd_support import (
    BLOCK_TOKENS,
    post,
    sglang_body,
    start_engine,
    stats,
    transfer_seconds,
)
from tests.enginesim.support import ERROR_KEYS, MODEL, chat, prompt
from tests.support import Proc, eventually, free_port, running

pytestmark = pytest.mark.integration

PROMPT_TOKENS = 200
# Short, so that a side waiting for one that never comes gives up within the test.
TIMEOUT_S = 1.5
_rooms = itertools.count(7_000_000_000)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    tmp: Path = tmp_path_factory.mktemp("pd-sglang")
    wait = ["--transfer-timeout", str(TIMEOUT_S)]
    with running([]) as procs:
        engines = {
            "prefill": start_engine(tmp, "sglang", "prefill", "--bootstrap-port", "0", *wait),
            "decode": start_engine(tmp, "sglang", "decode", *wait),
            "both": start_engine(tmp, "sglang", "both"),
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


async def bootstrap_port(http: aiohttp.ClientSession, fleet: dict[str, Proc]) -> int:
    port: int = (await stats(http, fleet["prefill"]))["bootstrap_port"]
    return port


async def pair(
    http: aiohttp.ClientSession, fleet: dict[str, Proc], client: dict[str, Any]
) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """Both engines' answers to one request, sent to both at once."""
    body = sglang_body(client, await bootstrap_port(http, fleet), next(_rooms))
    prefill, decode = await asyncio.gather(
        post(http, fleet["prefill"], body), post(http, fleet["decode"], body)
    )
    return prefill, decode


def client_body(start: int, **extra: Any) -> dict[str, Any]:
    return chat(prompt(PROMPT_TOKENS, start), max_tokens=5, **extra)


async def test_both_sides_meet_and_the_decode_answers(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    (p_status, p_out), (d_status, d_out) = await pair(http, fleet, client_body(0))
    assert (p_status, d_status) == (200, 200)
    assert p_out["usage"]["completion_tokens"] == 1  # SGLang's prefill makes one token
    assert d_out["usage"]["completion_tokens"] == 5
    tokens = d_out["usage"]["prompt_tokens"]
    got = await stats(http, fleet["decode"])
    assert (got["decoded_from_remote"], got["transferred_tokens"], got["role"]) == (
        1,
        tokens,
        "decode",
    )
    assert got["transfer_seconds"] == pytest.approx(transfer_seconds(tokens))
    prefill = await stats(http, fleet["prefill"])
    assert (prefill["prefilled_for_remote"], prefill["rooms"]) == (1, 0)


async def test_decode_streams_with_openai_client_after_the_transfer(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(1)
    body = sglang_body(client, await bootstrap_port(http, fleet), next(_rooms))
    extra = {k: body[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
    async with openai.AsyncOpenAI(
        base_url=f"{fleet['decode'].url}/v1", api_key="x", max_retries=0, timeout=20
    ) as oa:

        async def decode() -> tuple[float, str, Any]:
            sent = time.monotonic()
            stream = await oa.chat.completions.create(
                model=MODEL,
                messages=client["messages"],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
            first, text, usage = None, "", None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.monotonic()
                    text += chunk.choices[0].delta.content
                usage = chunk.usage or usage
            assert first is not None
            return first - sent, text, usage

        (ttft, text, usage), (p_status, _) = await asyncio.gather(
            decode(), post(http, fleet["prefill"], body)
        )
    assert p_status == 200 and len(text.split()) == 5
    got = await stats(http, fleet["decode"])
    assert got["transfer_seconds"] == pytest.approx(transfer_seconds(usage.prompt_tokens))
    assert ttft >= got["transfer_seconds"] * 0.99  # slept before the first token


async def test_decode_holds_the_blocks_and_is_sent_only_the_rest(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = client_body(2)
    assert [s for s, _ in await pair(http, fleet, client)] == [200, 200]
    first = await stats(http, fleet["decode"])
    # The next turn: the decode engine tells the prefill side what it holds.
    longer = chat(prompt(PROMPT_TOKENS, 2) + prompt(40, 900), max_tokens=5)
    (_, _), (status, out) = await pair(http, fleet, longer)
    assert status == 200
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (first["transferred_tokens"] // BLOCK_TOKENS - 1) * BLOCK_TOKENS
    got = await stats(http, fleet["decode"])
    assert got["transferred_tokens"] - first["transferred_tokens"] == (
        out["usage"]["prompt_tokens"] - cached
    )


async def test_decode_without_its_prefill_side_times_out(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    body = sglang_body(client_body(3), await bootstrap_port(http, fleet), next(_rooms))
    status, out = await post(http, fleet["decode"], body)
    assert status == 500 and set(out["error"]) == ERROR_KEYS
    assert "no answer within" in out["error"]["message"]
    assert (await stats(http, fleet["decode"]))["transfer_failures"] == 1
    await eventually(lambda: _no_rooms(http, fleet), timeout=5)


async def test_prefill_without_its_decode_side_times_out(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    body = sglang_body(client_body(4), await bootstrap_port(http, fleet), next(_rooms))
    status, out = await post(http, fleet["prefill"], body)
    assert status == 500 and "prefill bootstrap" in out["error"]["message"]
    got = await stats(http, fleet["prefill"])
    assert (got["transfer_failures"], got["requests"], got["rooms"]) == (1, 0, 0)


async def test_dead_prefill_engine_fails_the_decode_at_once(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    body = sglang_body(client_body(5), free_port(), next(_rooms))  # nothing listens there
    status, out = await post(http, fleet["decode"], body)
    assert status == 500 and "decode bootstrap" in out["error"]["message"]


async def test_missing_bootstrap_fields_fail_as_sglang_servers_do(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    # The decode server cannot find a prefill server: at once. The prefill server waits its
    # bootstrap timeout for a decode side that cannot find it.
    status, out = await post(http, fleet["decode"], client_body(6))
    assert status == 500 and "names no prefill server" in out["error"]["message"]
    status, out = await post(http, fleet["prefill"], client_body(6))
    assert status == 500 and "Prefill bootstrap failed" in out["error"]["message"]


async def test_bad_bootstrap_fields_are_400(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    for bad in ({"bootstrap_room": "r"}, {"bootstrap_port": 0}, {"bootstrap_host": 7}):
        status, out = await post(http, fleet["decode"], client_body(7, **bad))
        assert status == 400 and out["error"]["param"] == next(iter(bad))


async def test_both_role_ignores_bootstrap_fields(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    body = sglang_body(client_body(8), free_port(), next(_rooms))
    status, out = await post(http, fleet["both"], body)
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert (await stats(http, fleet["both"]))["whole"] == 1


@pytest.mark.parametrize("side", ["prefill", "decode"])
async def test_abort_stops_a_side_waiting_for_the_other(
    http: aiohttp.ClientSession, fleet: dict[str, Proc], side: str
) -> None:
    body = sglang_body(client_body(9), await bootstrap_port(http, fleet), next(_rooms))
    body["rid"] = f"wait-{side}"
    waiting = asyncio.create_task(post(http, fleet[side], body))

    async def in_room() -> None:
        assert (await stats(http, fleet["prefill"]))["rooms"] == 1

    await eventually(in_room, timeout=5)
    assert (await stats(http, fleet[side]))["waiting"] == 1  # queued, as a waiting request
    async with http.post(f"{fleet[side].url}/abort_request", json={"rid": body["rid"]}) as r:
        assert r.status == 200
    with pytest.raises(aiohttp.ClientError):
        await waiting  # the engine ends the aborted request's connection
    got = await stats(http, fleet[side])
    assert (got["aborted"], got["requests"]) == (1, 0)
    await eventually(lambda: _no_rooms(http, fleet), timeout=5)


async def test_abort_on_both_sides_stops_a_decoding_request(
    http: aiohttp.ClientSession, fleet: dict[str, Proc]
) -> None:
    client = chat(prompt(PROMPT_TOKENS, 10), max_tokens=4000, stream=True)
    body = {**sglang_body(client, await bootstrap_port(http, fleet), next(_rooms)), "rid": "both"}
    prefill = asyncio.create_task(post(http, fleet["prefill"], {**body, "stream": False}))
    async with http.post(f"{fleet['decode'].url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # decoding now
        assert (await prefill)[0] == 200
        for proc in (fleet["prefill"], fleet["decode"]):
            async with http.post(f"{proc.url}/abort_request", json={"rid": "both"}) as r:
                assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()
    got = await stats(http, fleet["decode"])
    assert (got["aborted"], got["decoded_from_remote"]) == (1, 1)


async def _no_rooms(http: aiohttp.ClientSession, fleet: dict[str, Proc]) -> None:
    assert (await stats(http, fleet["prefill"]))["rooms"] == 0
