"""Non-streamed answers: held while small (retried on failure), passed through once large."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from router.gateway.upstream.headers import UsageTail
from router.gateway.upstream.relay import HOLD_BYTES, HoldBudget
from tests.fakes import JSON, Script
from tests.gateway.test_exchange import CHAT, chat, rig

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
