"""What stops an engine-sim request early: its connection closing (vllm), SGLang's abort by
rid (both kinds), and the count of tokens generated after the client left."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from router.core.engine_model import EngineSpec
from router.enginesim.engine import EngineKind, SimSettings
from tests.enginesim.support import completion, engine, get_json, post, wait_for_stats

# 1000 tokens at 20 per second: far from done when the client leaves.
SLOW = EngineSpec(prefill_tokens_per_s=1e6, decode_tokens_per_s=20)
LONG = completion(max_tokens=1000, stream=True)


def timed(kind: EngineKind) -> SimSettings:
    return SimSettings(spec=SLOW, kind=kind)


async def test_vllm_kind_connection_close_stops_generation_nothing_after() -> None:
    async with engine(timed("vllm")) as http:
        async with http.post("/v1/completions", json=LONG) as r:
            await r.content.readuntil(b"\n\n")
            r.close()
        after = await wait_for_stats(http, "running", 0)
    assert after["tokens_after_disconnect"] == 0
    assert 0 < after["completion_tokens"] < 1000


async def test_sglang_kind_generates_on_after_close_until_its_abort() -> None:
    async with engine(timed("sglang")) as http:
        async with http.post("/v1/completions", json={**LONG, "rid": "r-1"}) as r:
            await r.content.readuntil(b"\n\n")
            r.close()
        await wait_for_stats(http, "disconnected", 1)
        # The connection is gone, the request is not: SGLang notices a closed one late.
        await asyncio.sleep(0.15)  # three decode steps pass with nobody reading
        assert (await get_json(http, "/stats"))["running"] == 1
        assert (await post(http, "/abort_request", {"rid": "r-1"}))[0] == 200
        after = await wait_for_stats(http, "running", 0)
    assert after["aborted"] == 1
    assert 0 < after["tokens_after_disconnect"] < 1000


async def test_abort_by_request_id_header_stops_a_live_stream() -> None:
    async with engine(timed("sglang")) as http:
        headers = {"X-Request-Id": "hdr-7"}
        async with http.post("/v1/completions", json=LONG, headers=headers) as r:
            await r.content.readuntil(b"\n\n")
            assert (await post(http, "/abort_request", {"rid": "hdr-7"}))[0] == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.content.read()  # the engine ends the aborted answer
        after = await wait_for_stats(http, "running", 0)
    assert (after["aborted"], after["tokens_after_disconnect"]) == (1, 0)


async def test_abort_all_stops_every_request() -> None:
    async with engine(timed("sglang")) as http:
        streams = [
            await http.post("/v1/completions", json={**LONG, "rid": f"a{i}"}) for i in range(3)
        ]
        for r in streams:
            await r.content.readuntil(b"\n\n")
            r.close()
        await wait_for_stats(http, "disconnected", 3)
        assert (await post(http, "/abort_request", {"abort_all": True}))[0] == 200
        after = await wait_for_stats(http, "running", 0)
    assert after["aborted"] == 3


async def test_abort_unknown_rid_is_harmless() -> None:
    async with engine(timed("sglang")) as http:
        assert (await post(http, "/abort_request", {"rid": "nobody"}))[0] == 200
        after = await get_json(http, "/stats")
    assert (after["aborted"], after["running"]) == (0, 0)


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"rid": 5}', b'{"rid": ""}', b'{"abort_all": "yes"}', b"{"],
    ids=["empty", "array", "rid-number", "rid-empty", "abort-all-text", "broken-json"],
)
async def test_abort_bad_body_is_a_400_in_shape(body: bytes) -> None:
    async with engine(timed("sglang")) as http, http.post("/abort_request", data=body) as r:
        status, answer = r.status, await r.json(content_type=None)
    assert status == 400 and "message" in answer["error"]


async def test_sglang_kind_request_left_alone_ends_at_its_schedule_and_counts_the_rest() -> None:
    spec = EngineSpec(prefill_tokens_per_s=1e6, decode_tokens_per_s=200)
    async with engine(SimSettings(spec=spec, kind="sglang")) as http:
        body = completion(max_tokens=40, stream=True, rid="alone")
        async with http.post("/v1/completions", json=body) as r:
            await r.content.readuntil(b"\n\n")
            r.close()
        after = await wait_for_stats(http, "running", 0)
    # Never aborted: it generated the rest of its 40 tokens for nobody.
    assert after["aborted"] == 0
    assert 0 < after["tokens_after_disconnect"] < 40
