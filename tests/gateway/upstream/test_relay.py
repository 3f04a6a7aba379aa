"""The relays: non-streamed answers held while small (retried on failure), passed through once
large; a stream's head leaving with its first event; where a stream ends."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from unittest import mock

import aiohttp
import orjson
import pytest
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request

from router.gateway.openai import sse
from router.gateway.upstream.headers import UsageTail
from router.gateway.upstream.relay import HOLD_BYTES, EventStream, HoldBudget, ends_stream
from tests.fakes import JSON, SSE, Script
from tests.gateway.rig import CHAT, EVENT, chat, rig

CHUNK = 64 * 1024


def big_answer(size: int, prompt: int = 40, cached: int = 16) -> list[bytes]:
    """An OpenAI chat answer of about ``size`` bytes, usage last, in CHUNK-byte pieces."""
    body = orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * size}}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )
    return [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]


class Watched(HoldBudget):
    """A budget that remembers the most it ever held."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.most = 0

    def take(self, n: int) -> bool:
        ok = super().take(n)
        self.most = max(self.most, self.held)
        return ok


async def test_large_answer_passed_through_whole_usage_counted_hold_bounded(
    tmp_path: Path,
) -> None:
    chunks = big_answer(4 * HOLD_BYTES)
    async with rig(tmp_path) as r:
        budget = Watched(2 * HOLD_BYTES)
        r.gw.services = dataclasses.replace(r.gw.services, holds=budget)
        headers = {**JSON, "Content-Length": str(sum(map(len, chunks)))}
        r.up.next(Script(headers=headers, chunks=list(chunks)))
        async with r.client.post(CHAT, json=chat()) as resp:
            assert resp.status == 200 and resp.content_length == sum(map(len, chunks))
            got = await resp.read()
        assert got == b"".join(chunks)
        assert budget.held == 0 and budget.most == HOLD_BYTES
        assert await r.metric("kvrouter_prompt_tokens_total") == 40
        assert await r.metric("kvrouter_cached_tokens_total") == 16
        assert r.up.unfinished() == []


async def test_large_answer_breaking_after_client_bytes_cut_not_retried_engine_blamed(
    tmp_path: Path,
) -> None:
    chunks = big_answer(4 * HOLD_BYTES)
    async with rig(tmp_path) as r:
        r.up.next(Script(chunks=list(chunks), drop_after=len(chunks) // 2))
        with pytest.raises(aiohttp.ClientPayloadError):
            async with r.client.post(CHAT, json=chat()) as resp:
                assert resp.status == 200
                await resp.read()  # a short read, never a whole answer
        assert len(r.up.sent) == 1  # the client had bytes: nothing can be retried
        assert await r.metric("kvrouter_backend_requests_total", code="error") == 1
        assert await r.metric("kvrouter_retries_total") == 0


async def test_small_answer_breaking_is_held_and_retried_elsewhere(tmp_path: Path) -> None:
    chunks = big_answer(HOLD_BYTES // 4)
    async with rig(tmp_path) as r:
        r.up.next(Script(chunks=list(chunks), drop_after=2))
        status, body = await r.post(CHAT, chat())
        assert status == 200 and body["object"] == "chat.completion"
        assert len(r.up.sent) == 2 and await r.metric("kvrouter_retries_total") == 1


async def test_budget_spent_answers_pass_through_from_the_first_byte(tmp_path: Path) -> None:
    chunks = big_answer(HOLD_BYTES // 4)
    async with rig(tmp_path) as r:
        r.gw.services = dataclasses.replace(r.gw.services, holds=HoldBudget(0))  # none held
        r.up.next(Script(chunks=list(chunks), drop_after=2))
        with pytest.raises(aiohttp.ClientPayloadError):
            async with r.client.post(CHAT, json=chat()) as resp:
                await resp.read()
        assert len(r.up.sent) == 1


@pytest.mark.parametrize(
    ("tail_bytes", "expected"),
    [
        (1 << 20, (40, 16)),  # the whole body in the tail
        (300, (40, 16)),  # only the end: the usage object found by its braces
        (30, None),  # the usage object itself cut: nothing made up
    ],
)
def test_usage_tail_reads_a_json_answers_final_usage(
    tail_bytes: int, expected: tuple[int, int] | None
) -> None:
    tail = UsageTail(keep=tail_bytes)
    for chunk in big_answer(5000):
        for i in range(0, len(chunk), 7):  # tiny pieces: the tail keeps whole ones
            tail.feed(chunk[i : i + 7])
    assert tail.json_usage() == expected


async def test_large_answer_cut_by_the_gateways_stop_is_a_short_read_not_the_engines_fault(
    tmp_path: Path,
) -> None:
    chunks = big_answer(4 * HOLD_BYTES)
    async with rig(tmp_path) as r:
        r.up.next(Script(chunks=list(chunks), hang_after=len(chunks) // 2))
        async with r.client.post(CHAT, json=chat()) as resp:
            assert resp.status == 200
            await resp.content.readexactly(HOLD_BYTES)  # past the hold: being passed on
            await r.gw.drain.run(0.0, time.monotonic)  # the grace is over at once
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        assert await r.metric("kvrouter_requests_total", code="503") == 1
        assert await r.metric("kvrouter_backend_requests_total", code="error") == 0


# -- streams: one send for the head and the first event, the end at [DONE] --------------------


async def test_event_stream_head_and_first_event_leave_in_one_write() -> None:
    # Pins the aiohttp attribute EventStream relies on (_send_headers_immediately): if a new
    # aiohttp sends the head at prepare() again, this fails.
    writes: list[bytes] = []
    transport = mock.Mock(is_closing=lambda: False)
    transport.write.side_effect = lambda d: writes.append(bytes(d))
    transport.writelines.side_effect = lambda ds: writes.append(b"".join(ds))
    protocol = mock.Mock(transport=transport, _paused=False)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request(
        "POST", CHAT, writer=writer, protocol=protocol, transport=transport
    )
    out = EventStream(headers=SSE)
    await out.prepare(request)
    assert writes == []
    await out.write(b"data: 1\n\n")
    (sent,) = writes
    assert sent.startswith(b"HTTP/1.1 200 OK\r\n") and sent.endswith(b"data: 1\n\n\r\n")
    await out.write_eof()
    assert writes[1:] == [b"0\r\n\r\n"]


@pytest.mark.parametrize(
    ("chunk", "at_event", "ends"),
    [
        (sse.DONE, True, True),
        (EVENT + sse.DONE, False, True),
        (sse.DONE, False, False),  # the chunk before ended mid-event: this is not an event
        (EVENT, True, False),
        (b'data: {"a": 1}\ndata: [DONE]\n\n', True, False),  # a two-line event's data
        (b"xdata: [DONE]\n\n", True, False),
        (b"data: [DONE]\r\n\r\n", True, False),  # other line ends: the engine's end decides
    ],
    ids=["alone", "after-event", "alone-mid-event", "in-content", "second-data-line",
         "mid-line", "crlf"],
)  # fmt: skip
def test_ends_stream_only_a_whole_done_event(chunk: bytes, at_event: bool, ends: bool) -> None:
    assert ends_stream(chunk, at_event) is ends


STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
COMPLETED = b'event: response.completed\ndata: {"type":"response.completed"}\n\n'
DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n'


@pytest.mark.parametrize(
    ("chunk", "at_event", "ends"),
    [
        (STOP, True, True),
        (DELTA + STOP, False, True),
        (COMPLETED, True, True),
        (b"event: response.failed\ndata: {}\n\n", True, True),
        (b"event: response.incomplete\ndata: {}\n\n", True, True),
        (STOP, False, False),  # the chunk before ended mid-event
        (STOP + DELTA, True, False),  # something came after it
        (DELTA, True, False),
        (b'event: response.output_text.delta\ndata: {"delta":"event: message_stop"}\n\n', True,
         False),
    ],
    ids=["stop", "after-delta", "completed", "failed", "incomplete", "mid-event", "not-last",
         "delta", "name-in-data"],
)  # fmt: skip
def test_ends_stream_the_other_apis_last_events(chunk: bytes, at_event: bool, ends: bool) -> None:
    assert ends_stream(chunk, at_event) is ends
