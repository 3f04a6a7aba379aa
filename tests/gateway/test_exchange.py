"""The exchange in-process over ``FakeUpstream``: relaying answers as they come, and streams that
end or fail after they started.

Every test ends by checking that the load the router took is all given back and that every
upstream response was released or aborted (tests.gateway.rig).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.core.token_scale import MIN_REQUESTS
from router.gateway.app import build_app
from router.gateway.config.serving import Forwarding, Timeouts
from router.gateway.openai import sse
from router.gateway.wiring import Gateway
from tests.fakes import SSE, FakeEngine, Script, openai_answer
from tests.gateway.rig import (
    CHAT,
    EVENT,
    POLICY,
    A,
    B,
    C,
    assert_all_released,
    chat,
    config,
    ready_now,
    rig,
)
from tests.support import eventually, metric_in

# -- relaying ------------------------------------------------------------------------------


async def test_exchange_nonstream_sends_original_bytes_relays_answer(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        raw = b'{ "messages" : [{"content":"hi there","role":"user"}],\n "model":"m" , "x": 1.50}'
        status, body = await r.post(CHAT, raw)
        assert status == 200 and body["object"] == "chat.completion"
        sent = [q for e in r.up.engines.values() for q in e.requests]
        assert [q.body for q in sent] == [raw]
        assert sent[0].path == CHAT


@pytest.mark.parametrize("trusted", [False, True], ids=["default", "forwarding-configured"])
async def test_exchange_headers_hop_by_hop_dropped_client_auth_per_config_xff_appended(
    tmp_path: Path, trusted: bool
) -> None:
    forwarding = Forwarding(client_credentials=trusted, trust_forwarding_headers=trusted)
    async with rig(tmp_path, forwarding=forwarding) as r:
        headers = {
            "Authorization": "Bearer client-key",
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic x",
            "TE": "trailers",
            "X-Forwarded-For": "203.0.113.7",
            "X-Request-Id": "abc",
            "Accept-Encoding": "gzip",
        }
        status, _ = await r.post(CHAT, chat(), headers=headers)
        assert status == 200
        (q,) = [q for e in r.up.engines.values() for q in e.requests]
        sent = {k.lower(): v for k, v in q.headers}
        if trusted:
            assert sent["authorization"] == "Bearer client-key"
            assert sent["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
        else:
            assert "authorization" not in sent  # the client's key for the gateway stays here
            assert sent["x-forwarded-for"] == "127.0.0.1"  # what the client wrote is not believed
        assert sent["x-request-id"] == "abc"
        assert sent["accept-encoding"] == "identity"
        for hop in ("connection", "x-secret-hop", "keep-alive", "proxy-authorization", "te"):
            assert hop not in sent
        assert "host" not in sent and "content-length" not in sent


async def test_exchange_stream_relayed_byte_for_byte_usage_counted(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        body = chat(stream=True, stream_options={"include_usage": True})
        expected = b"".join(openai_answer(body, cached=0).chunks)
        async with r.client.post(CHAT, json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            got = await resp.read()
        assert got == expected
        assert await r.metric("kvrouter_ttft_seconds_count") == 1
        assert await r.metric("kvrouter_prompt_tokens_total") == 10


async def test_exchange_usage_cached_tokens_counted_nonstream(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, cached=8)) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
        assert await r.metric("kvrouter_cached_tokens_total") == 8
        assert await r.metric("kvrouter_prompt_tokens_total") == 10


async def test_exchange_repeated_prefix_same_backend_overlap_recorded(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A), FakeEngine(B), FakeEngine(C)) as r:
        system = "You are a helpful assistant that answers in French. " * 4
        for i in range(4):
            body = {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
            }
            assert (await r.post(CHAT, body))[0] == 200
        assert len(set(r.up.sent)) == 1
        assert await r.metric("kvrouter_prefix_overlap_ratio_sum") > 0
        assert await r.metric("kvrouter_index_blocks") > 0


async def test_sse_headers_from_engine_relayed_only_the_allowed(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        extra = {"x-ratelimit-limit-requests": "60", "X-Engine": "a", "Connection": "close"}
        r.up.next(stream_script(headers={**SSE, **extra}))
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.headers["x-ratelimit-limit-requests"] == "60"
            assert "X-Engine" not in resp.headers  # an engine's own header stays inside
            assert resp.headers.get("Connection", "").lower() != "close"
            await resp.read()


@dataclasses.dataclass
class StreamingEngine:
    """An engine on loopback that streams ``first`` in one write, then ``rest`` when told."""

    first: list[bytes]
    rest: list[bytes]
    release: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    url: str = ""

    @staticmethod
    def frame(events: list[bytes]) -> bytes:
        return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                elif head.startswith(b"GET"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + self.frame(self.first)
                    )
                    await self.release.wait()
                    writer.write(self.frame(self.rest) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_exchange_real_upstream_events_that_come_together_relayed_at_once_in_order(
    tmp_path: Path,
) -> None:
    events = [
        sse.encode(orjson.dumps({"choices": [{"delta": {"content": f"t{i}"}}]})) for i in range(6)
    ]
    engine = StreamingEngine(events[:3], [*events[3:], sse.DONE])
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    timeouts = Timeouts(connect_seconds=2, first_byte_seconds=5, idle_stream_seconds=5)
    gw = Gateway(config(engine.url, timeouts=timeouts), policy, environ={})
    client = TestClient(TestServer(build_app(gw)))
    await client.start_server()
    try:
        await eventually(lambda: ready_now(client), timeout=5.0, interval=0.01)
        async with client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            got = b""
            # The first three events reach the client while the engine holds back the rest:
            # what has arrived is relayed, never held for more.
            for _ in range(100):
                if len(got) >= len(b"".join(events[:3])):
                    break
                got += await asyncio.wait_for(resp.content.readany(), 5)
            assert got == b"".join(events[:3])
            engine.release.set()
            got += await resp.read()
        assert got == b"".join([*events, sse.DONE])
        decoded = sse.Decoder().feed(got)
        assert [e.data for e in decoded[:-1]] == [e[6:-2].decode() for e in events]
        assert decoded[-1].done
        assert (
            metric_in(
                await (await client.get("/metrics")).text(), "kvrouter_requests_total", code="200"
            )
            == 1
        )
    finally:
        await client.close()
        server.close()


@pytest.mark.parametrize(
    "after",
    [{"chunks": [b"data: late\n\n"]}, {"drop_after": 2}],
    ids=["bytes-after-done", "dropped-after-done"],
)
async def test_exchange_stream_ends_at_done_engine_rest_not_relayed(
    tmp_path: Path, after: dict[str, Any]
) -> None:
    async with rig(tmp_path) as r:
        chunks = [EVENT, sse.DONE, *after.get("chunks", [])]
        r.up.next(Script(headers=dict(SSE), chunks=chunks, drop_after=after.get("drop_after")))
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            got = await resp.read()
        assert got == EVENT + sse.DONE  # whole, and nothing after [DONE], no error event
        assert r.up.responses[0].aborted  # the engine's connection is not reused
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="200") == 1
        assert await r.metric("kvrouter_backend_healthy", backend=r.up.sent[0]) == 1


# -- streams that fail after they started --------------------------------------------------


def stream_script(**kw: Any) -> Script:
    body = chat(stream=True)
    return dataclasses.replace(openai_answer(body), **kw)


async def read_events(resp: aiohttp.ClientResponse) -> list[sse.Event]:
    dec = sse.Decoder()
    events: list[sse.Event] = []
    async for chunk in resp.content.iter_any():
        events.extend(dec.feed(chunk))
    return events


@pytest.mark.parametrize(
    ("script", "code", "status_label"),
    [
        (stream_script(drop_after=2), "upstream_dropped", "502"),
        (stream_script(hang_after=1), "upstream_timeout", "504"),
    ],
    ids=["dropped", "idle-timeout"],
)
async def test_exchange_mid_stream_failure_ends_with_error_event(
    tmp_path: Path, script: Script, code: str, status_label: str
) -> None:
    async with rig(tmp_path) as r:
        r.up.next(script)
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            events = await read_events(resp)
        assert events, "the stream must have started"
        last = json.loads(events[-1].data)
        assert last["error"]["code"] == code
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert not any(e.done for e in events)
        assert len(r.up.sent) == 1  # not retried: the client had bytes
        assert await r.metric("kvrouter_requests_total", route=CHAT, code=status_label) == 1


async def test_exchange_client_disconnect_mid_stream_aborts_engine_request(tmp_path: Path) -> None:
    async with rig(
        tmp_path,
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=5, idle_stream_seconds=30),
    ) as r:
        r.up.next(stream_script(hang_after=1))
        resp = await r.client.post(CHAT, json=chat(stream=True))
        assert resp.status == 200
        await resp.content.readany()
        assert r.gw.core.loads.local_all() != {}
        resp.close()  # the client goes away mid-stream
        await eventually(lambda: r.up.responses[0].aborted, timeout=2.0, interval=0.01)
        assert r.up.responses[0].aborted
        await assert_all_released(r)
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="499") == 1


async def test_exchange_client_disconnect_before_first_byte_releases_load(tmp_path: Path) -> None:
    async with rig(
        tmp_path,
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30),
    ) as r:
        r.up.next(Script(hang=True))
        with pytest.raises(asyncio.TimeoutError):
            await r.client.post(CHAT, json=chat(), timeout=aiohttp.ClientTimeout(total=0.2))
        await assert_all_released(r)
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="499") == 1


async def test_exchange_usage_teaches_the_core_the_engines_token_size(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        prompt = "the router counts four characters a token"
        for _ in range(MIN_REQUESTS):
            status, _ = await r.post(CHAT, chat(prompt))
            assert status == 200
        # The fake engine counts every prompt as 10 tokens of its own, whatever its length.
        d = r.gw.core.decide(chat(prompt), [A], now=0.0)
        assert r.gw.core.sizes.scale.ratio == pytest.approx(d.prompt_tokens / 10, rel=0.06)
        # And the scorers read their engine-token params at that ratio.
        assert d.inputs.token_scale == r.gw.core.sizes.scale.ratio != 1.0
