"""``Deadline``: one timer behind an attempt's waits, each wait on its own limit."""

from __future__ import annotations

import asyncio

import pytest

from router.gateway.upstream.deadline import Deadline


async def wait_on(deadline: Deadline, seconds: float, pause: float) -> str:
    """One guarded wait of ``pause`` seconds: "ok", "expired" or "cancelled"."""
    deadline.start(seconds)
    try:
        await asyncio.sleep(pause)
        return "ok"
    except asyncio.CancelledError:
        return "expired" if deadline.expired() else "cancelled"
    finally:
        deadline.stop()


async def test_deadline_short_waits_never_expire_however_long_the_stream() -> None:
    async def stream() -> list[str]:
        deadline = Deadline(0.1)
        try:
            # 25 waits of 10 ms against a 100 ms limit: 250 ms in all, each well inside.
            return [await wait_on(deadline, 0.1, 0.01) for _ in range(25)]
        finally:
            deadline.close()

    assert await asyncio.wait_for(stream(), 10) == ["ok"] * 25


@pytest.mark.parametrize("shortest", [0.05, 30], ids=["told-the-shortest", "told-nothing-shorter"])
async def test_deadline_shorter_wait_after_longer_expires_on_its_own_limit(
    shortest: float,
) -> None:
    async def attempt() -> list[str]:
        deadline = Deadline(shortest)
        try:
            first = await wait_on(deadline, 30, 0)  # a first byte allowed 30 s, there at once
            idle = await wait_on(deadline, 0.05, 30)  # then an idle limit of 50 ms
            return [first, idle]
        finally:
            deadline.close()

    # Well before the first wait's 30 s: the timer was brought forward for the second.
    assert await asyncio.wait_for(attempt(), 10) == ["ok", "expired"]


async def test_deadline_other_cancellation_is_not_a_timeout() -> None:
    results: list[str] = []
    waiting = asyncio.Event()

    async def attempt() -> None:
        deadline = Deadline(30)
        try:
            deadline.start(30)
            waiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                results.append("expired" if deadline.expired() else "cancelled")
                raise
            finally:
                deadline.stop()
        finally:
            deadline.close()

    task = asyncio.create_task(attempt())
    await waiting.wait()
    task.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await task
    assert results == ["cancelled"]
