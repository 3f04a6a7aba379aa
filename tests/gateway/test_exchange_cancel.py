"""Cancellation through the exchange, in process: an SGLang engine's attempts carry a rid of
their own, and a client that leaves gets that rid aborted; nothing is left held."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import orjson
import pytest

from router.gateway.config.engines import EngineSources
from router.gateway.config.serving import Timeouts
from tests.fakes import FakeEngine, Script, openai_answer
from tests.gateway.rig import CHAT, A, B, assert_all_released, chat, rig
from tests.support import eventually

SGLANG = EngineSources(static=(A,), static_kinds={A: "sglang"})
SLOW = Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30)


def rid_of(engine: FakeEngine, i: int = -1) -> str:
    rid: str = orjson.loads(engine.requests[i].body)["rid"]
    return rid


async def test_sglang_attempt_names_a_rid_a_vllm_one_does_not(tmp_path: Path) -> None:
    sg = FakeEngine(A)
    async with rig(tmp_path, sg, engines=SGLANG) as r:
        status, _ = await r.post(CHAT, chat(), headers={"X-Request-Id": "client-id-1"})
        assert status == 200
        assert rid_of(sg).startswith("client-id-1-")
        assert sg.fetched == []  # answered in full: nothing to abort
    vl = FakeEngine(A)
    async with rig(tmp_path, vl) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
        assert "rid" not in orjson.loads(vl.requests[-1].body)


async def test_sglang_client_leaving_mid_stream_aborts_its_rid(tmp_path: Path) -> None:
    sg = FakeEngine(A)
    async with rig(tmp_path, sg, engines=SGLANG, timeouts=SLOW) as r:
        script = dataclasses.replace(openai_answer(chat(stream=True)), hang_after=1)
        r.up.next(script)
        resp = await r.client.post(CHAT, json=chat(stream=True))
        await resp.content.readany()
        resp.close()
        await eventually(lambda: sg.fetched)
        assert sg.fetched == [("/abort_request", orjson.dumps({"rid": rid_of(sg)}))]
        await assert_all_released(r)
        assert await r.metric("kvrouter_engine_aborts_total", result="sent") == 1


async def test_sglang_client_leaving_before_the_first_byte_aborts_its_rid(tmp_path: Path) -> None:
    sg = FakeEngine(A)
    async with rig(tmp_path, sg, engines=SGLANG, timeouts=SLOW) as r:
        r.up.next(Script(hang=True))
        with pytest.raises(asyncio.TimeoutError):
            await r.client.post(CHAT, json=chat(), timeout=aiohttp.ClientTimeout(total=0.2))
        await eventually(lambda: sg.fetched)
        assert [path for path, _ in sg.fetched] == ["/abort_request"]
        await assert_all_released(r)


async def test_sglang_first_byte_timeout_aborts_and_the_retry_has_its_own_rid(
    tmp_path: Path,
) -> None:
    engines = FakeEngine(A), FakeEngine(B)
    both = EngineSources(static=(A, B), static_kinds={A: "sglang", B: "sglang"})
    timeouts = Timeouts(connect_seconds=1, first_byte_seconds=0.2, idle_stream_seconds=5)
    async with rig(tmp_path, *engines, engines=both, timeouts=timeouts) as r:
        r.up.next(Script(hang=True))  # the first attempt, wherever it goes, never answers
        status, _ = await r.post(CHAT, chat())
        assert status == 200
        first, second = (e for url in r.up.sent for e in engines if e.url == url)
        assert rid_of(first) != rid_of(second)
        await eventually(lambda: first.fetched)
        # Only the attempt the engine never answered is aborted.
        assert first.fetched == [("/abort_request", orjson.dumps({"rid": rid_of(first)}))]
        assert second.fetched == []
