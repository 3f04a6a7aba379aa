"""A split request under SGLang's protocol, in process (router.gateway.disagg.sglang): one
body with the bootstrap fields to a prefill and a decode engine at once; a failed side gives
the other up and the pair is redone; a client that leaves aborts both; the client never sees
the bootstrap fields; every lease given back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from router.gateway.config.serving import Timeouts
from router.gateway.disagg import wire
from router.gateway.openai import sse
from tests.fakes import SSE, FakeEngine, Script, error_answer
from tests.gateway.disagg.pd_rig import BOOTSTRAP_PORT, D2, P2, D, P, body_of, chat, engines, pd
from tests.gateway.rig import CHAT, assert_all_released, rig
from tests.support import eventually

SLOW = Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30)


def rid_of(engine: FakeEngine, i: int = -1) -> str:
    rid: str = body_of(engine.requests[i])["rid"]
    return rid


def aborts(engine: FakeEngine) -> list[str]:
    return [orjson.loads(body)["rid"] for path, body in engine.fetched if path == "/abort_request"]


@pytest.mark.parametrize("stream", [False, True])
async def test_both_engines_get_one_body_with_the_bootstrap_fields(
    tmp_path: Path, stream: bool
) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("sglang", (P, D))) as r:
        if stream:
            echo = orjson.dumps({"choices": [{"delta": {"content": "a"}}], "bootstrap_room": 1})
            d.scripts.append(Script(headers=dict(SSE), chunks=[sse.encode(echo), sse.DONE]))
        else:
            echo = orjson.dumps({"id": "d", "choices": [], "bootstrap_host": "prefill-0"})
            d.scripts.append(Script(chunks=[echo]))
        client = chat(stream=stream, max_tokens=8)
        status, body = await r.post(CHAT, client)
        assert status == 200
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        assert b"bootstrap" not in raw
        (pre,), (dec,) = p.requests, d.requests
        # One body for both but for SGLang's request id, each engine's own (its abort names it).
        sent, other = body_of(pre), body_of(dec)
        assert sent.pop("rid") != other.pop("rid")
        assert sent == other
        assert list(sent)[: len(client)] == list(client)
        room = sent["bootstrap_room"]
        assert sent == wire.sglang(client, "prefill-0", BOOTSTRAP_PORT, room)
        assert isinstance(room, int) and 0 <= room < 2**63
        m = r.metric
        assert await m("kvrouter_disagg_decisions_total", path="split", why="protocol-splits") == 1


async def test_a_prefill_failing_gives_the_decode_up_and_the_pair_is_redone(
    tmp_path: Path,
) -> None:
    p, p2, d = engines(P, P2, D)
    async with rig(
        tmp_path, p, p2, d, timeouts=SLOW, **pd("sglang", (P, P2, D), sglang_kind=True)
    ) as r:
        # A pair's prefill request goes out first: the first prefill engine fails while the
        # decode engine waits for its blocks; the next pair answers.
        r.up.next(error_answer(500), Script(chunks=[b'{"never": 1}'], gate=asyncio.Event()))
        status, body = await r.post(CHAT, chat())
        assert status == 200, body
        assert len(d.requests) == 2
        rooms = {body_of(q)["bootstrap_room"] for q in d.requests}
        assert len(rooms) == 2  # a new room for the new pair
        hosts = [body_of(q)["bootstrap_host"] for q in d.requests]
        assert sorted(hosts) == ["prefill-0", "prefill-1"]
        await eventually(lambda: aborts(d))
        assert aborts(d) == [rid_of(d, 0)]  # the decode attempt given up was aborted
        failed = p if hosts[0] == "prefill-0" else p2
        assert (
            await r.metric("kvrouter_backend_requests_total", backend=failed.url, code="500") == 1
        )
        assert await r.metric("kvrouter_retries_total") == 1


async def test_a_decode_failing_gives_the_prefill_up_and_the_pair_is_redone(
    tmp_path: Path,
) -> None:
    p, d, d2 = engines(P, D, D2)
    async with rig(
        tmp_path, p, d, d2, timeouts=SLOW, **pd("sglang", (P, D, D2), sglang_kind=True)
    ) as r:
        # The first pair's prefill is still under way when its decode engine fails; the next
        # pair answers.
        r.up.next(Script(chunks=[b'{"id": "p"}'], gate=asyncio.Event()), error_answer(503))
        status, body = await r.post(CHAT, chat())
        assert status == 200, body
        assert len(p.requests) == 2
        await eventually(lambda: aborts(p))
        assert aborts(p) == [rid_of(p, 0)]  # the first pair's prefill, given up
        assert {q.engine for q in (*d.requests, *d2.requests)} == {D, D2}


async def test_a_prefill_refusal_before_the_first_byte_is_relayed(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, timeouts=SLOW, **pd("sglang", (P, D))) as r:
        p.scripts.append(error_answer(400, "the prompt is too long"))
        d.scripts.append(Script(chunks=[b"{}"], gate=asyncio.Event()))
        status, body = await r.post(CHAT, chat())
        assert status == 400
        assert "too long" in body["error"]["message"]


async def test_a_prefill_failing_after_the_first_byte_leaves_the_answer(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, timeouts=SLOW, **pd("sglang", (P, D))) as r:
        gate = asyncio.Event()
        p.scripts.append(Script(status=500, chunks=[b'{"error": {}}'], gate=gate))
        events = [sse.encode(b'{"choices": [{"delta": {"content": "a"}}]}'), sse.DONE]
        d.scripts.append(Script(headers=dict(SSE), chunks=events, hang_after=1))
        resp = await r.client.post(CHAT, json=chat(stream=True))
        assert resp.status == 200 and await resp.content.readany()
        gate.set()  # the prefill fails once the client has its first bytes
        await eventually(lambda: r.metric("kvrouter_backend_requests_total", backend=P, code="500"))
        decode = next(x for x in r.up.responses if x.engine == D)
        assert not (decode.aborted or decode.released)  # the answer goes on
        resp.close()


async def test_a_client_leaving_aborts_both_engines(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, timeouts=SLOW, **pd("sglang", (P, D), sglang_kind=True)) as r:
        p.scripts.append(Script(hang=True))
        d.scripts.append(Script(hang=True))
        with pytest.raises(asyncio.TimeoutError):
            async with asyncio.timeout(0.3):
                await r.client.post(CHAT, json=chat())
        await eventually(lambda: aborts(p) and aborts(d))
        assert aborts(p) == [rid_of(p)] and aborts(d) == [rid_of(d)]
        await assert_all_released(r)


async def test_a_client_hanging_up_after_its_answer_leaves_no_load(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, timeouts=SLOW, **pd("sglang", (P, D))) as r:
        gate = asyncio.Event()
        p.scripts.append(Script(chunks=[b'{"id": "p"}'], gate=gate))  # answers late
        events = [sse.encode(b'{"choices": [{"delta": {"content": "a"}}]}'), sse.DONE]
        d.scripts.append(Script(headers=dict(SSE), chunks=events))
        resp = await r.client.post(CHAT, json=chat(stream=True))
        assert (await resp.content.read()).endswith(sse.DONE)
        resp.close()  # at once, as the openai client does
        await assert_all_released(r)
        prefill = next(x for x in r.up.responses if x.engine == P)
        assert prefill.aborted and p.fetched == []  # closed, and no abort: the pair was done
