"""A split request under vLLM's protocol, in process (router.gateway.disagg.vllm): the prefill
request, then the decode request with what the prefill engine answered; failures, retries and
a client that leaves; nothing of the protocol reaches the client; every lease given back."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import orjson
import pytest

from router.gateway.config.serving import Limits, Timeouts
from router.gateway.disagg import wire
from router.gateway.openai import sse
from tests.fakes import SSE, Script, error_answer, openai_answer
from tests.gateway.disagg.pd_rig import (
    D2,
    D,
    P,
    body_of,
    busy,
    chat,
    engines,
    header,
    pd,
    prefill_answer,
)
from tests.gateway.rig import CHAT, assert_all_released, rig

SLOW = Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30)


async def test_split_prefills_then_decodes_with_what_the_prefill_answered(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(Script(chunks=[prefill_answer()]))
        answer = orjson.dumps(
            {"id": "d", "object": "chat.completion", "choices": [], "kv_transfer_params": None}
        )
        d.scripts.append(Script(chunks=[answer]))
        client = chat(stream_options={"include_usage": True}, min_tokens=2)
        status, body = await r.post(CHAT, client, headers={"X-Request-Id": "req-7"})
        assert status == 200, body
        assert body == {"id": "d", "object": "chat.completion", "choices": []}
        (pre,), (dec,) = p.requests, d.requests
        assert body_of(pre) == wire.vllm_prefill(client)
        sent = orjson.loads(prefill_answer())["kv_transfer_params"]
        assert body_of(dec) == {**client, "kv_transfer_params": sent}
        assert header(pre, "X-Request-Id") == header(dec, "X-Request-Id") == "req-7"
        assert pre.path == dec.path == CHAT
        m = r.metric
        assert await m("kvrouter_disagg_decisions_total", path="split", why="split-cheaper") == 1
        assert await m("kvrouter_disagg_transfer_bytes_total") > 0
        assert await m("kvrouter_disagg_transfer_seconds_count") == 1
        assert await m("kvrouter_backend_requests_total", backend=P, code="200") == 1
        # Both engines hold the prompt now: the prefill engine made it, the decode engine got it.
        keys = r.gw.core.keys_of(chat())[1]
        now = r.gw.clock()
        assert r.gw.core.index.overlap(P, keys, now) == len(keys)
        assert r.gw.core.index.overlap(D, keys, now) == len(keys)


async def test_a_streamed_split_loses_kv_transfer_params_in_every_event(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(Script(chunks=[prefill_answer()]))
        events = [
            sse.encode(
                orjson.dumps({"choices": [{"delta": {"content": "a"}}], "kv_transfer_params": None})
            ),
            sse.encode(orjson.dumps({"choices": [{"delta": {"content": "b"}}]})),
            sse.DONE,
        ]
        d.scripts.append(Script(headers=dict(SSE), chunks=events))
        status, raw = await r.post(CHAT, chat(stream=True))
        assert status == 200
        assert isinstance(raw, bytes) and b"kv_transfer_params" not in raw
        assert raw.count(b"data: ") == 3 and raw.endswith(sse.DONE)
        assert body_of(p.requests[0])["stream"] is False
        assert body_of(d.requests[0])["stream"] is True


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (error_answer(500), "500"),
        (Script(connect_error=True), "error"),
        (Script(chunks=[b'{"partial'], drop_after=1), "error"),
    ],
    ids=["status-500", "connect-error", "dropped"],
)
async def test_a_failed_prefill_runs_the_request_whole_on_its_decode_engine(
    tmp_path: Path, failure: Script, code: str
) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(failure)
        status, body = await r.post(CHAT, chat())
        assert status == 200, body
        assert r.up.sent == [P, D]
        assert "kv_transfer_params" not in body_of(d.requests[0])  # a plain request
        assert await r.metric("kvrouter_backend_requests_total", backend=P, code=code) == 1
        assert await r.metric("kvrouter_retries_total") == 1
        # A request-shaped failure counts against its engine once another answered: either way.
        assert r.gw.pool.engines[P].health.failures == 1


async def test_a_prefill_failing_twice_over_is_the_requests_fault(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(error_answer(500))
        d.scripts.append(error_answer(500))
        status, body = await r.post(CHAT, chat())
        assert status == 502, body
        assert r.up.sent == [P, D]
        # Nobody else answered: neither engine is blamed for what the request may have caused.
        assert r.gw.pool.engines[P].health.failures == r.gw.pool.engines[D].health.failures == 0


async def test_one_attempt_allowed_a_failed_prefill_is_the_clients_error(tmp_path: Path) -> None:
    p, d = engines(P, D)
    changes = pd("vllm", (P, D))
    limits = Limits(max_body_bytes=4096, max_attempts=1)
    async with rig(tmp_path, p, d, limits=limits, **changes) as r:
        await busy(r, D)
        p.scripts.append(Script(connect_error=True))
        status, body = await r.post(CHAT, chat())
        assert status == 502, body
        assert r.up.sent == [P]


async def test_a_failed_decode_is_retried_with_the_same_kv_transfer_params(tmp_path: Path) -> None:
    p, d, d2 = engines(P, D, D2)
    async with rig(tmp_path, p, d, d2, **pd("vllm", (P, D, D2))) as r:
        await busy(r, D, D2)
        # The prefill, then whichever decode engine goes first, then the next.
        r.up.next(Script(chunks=[prefill_answer()]), error_answer(503))
        status, body = await r.post(CHAT, chat())
        assert status == 200, body
        sent = r.up.sent
        assert sent[0] == P and set(sent[1:]) == {D, D2} and len(sent) == 3
        bodies = [body_of(e.requests[0]) for e in (d, d2)]
        kv = orjson.loads(prefill_answer())["kv_transfer_params"]
        assert all(b["kv_transfer_params"] == kv for b in bodies)
        assert len(p.requests) == 1  # the prefill engine still holds the blocks: no new prefill
        assert await r.metric("kvrouter_retries_total") == 1


async def test_a_prefill_engines_refusal_is_relayed_and_nothing_decodes(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(error_answer(400, "prompt too long for this model"))
        status, body = await r.post(CHAT, chat())
        assert status == 400
        assert "prompt too long" in body["error"]["message"]
        assert r.up.sent == [P]


async def test_a_prefill_answer_without_params_leaves_a_plain_decode(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(Script(chunks=[b'{"id": "p", "choices": []}']))
        status, _ = await r.post(CHAT, chat(kv_transfer_params={"remote_host": "10.6.6.6"}))
        assert status == 200
        assert "kv_transfer_params" not in body_of(d.requests[0])


@pytest.mark.parametrize("side", ["prefill", "decode"])
async def test_a_client_leaving_cancels_the_engines_work(tmp_path: Path, side: str) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, timeouts=SLOW, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        if side == "prefill":
            p.scripts.append(Script(hang=True))
            with pytest.raises(asyncio.TimeoutError):
                await r.client.post(
                    CHAT, json=chat(stream=True), timeout=aiohttp.ClientTimeout(total=0.3)
                )
        else:  # mid-stream
            p.scripts.append(Script(chunks=[prefill_answer()]))
            d.scripts.append(dataclasses.replace(openai_answer(chat(stream=True)), hang_after=1))
            resp = await r.client.post(CHAT, json=chat(stream=True))
            assert await resp.content.readany()
            resp.close()
        await assert_all_released(r)
        assert r.up.sent == ([P] if side == "prefill" else [P, D])
        assert all(resp.aborted for resp in r.up.responses if not resp.released)
