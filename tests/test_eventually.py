"""``eventually``: what a probe's answer means, and that the wait is bounded in calls."""

from __future__ import annotations

import pytest

from tests.support import eventually


async def test_eventually_truthy_answer_returned() -> None:
    answers = iter([0, [], 7])
    assert await eventually(lambda: next(answers), interval=0.001) == 7


async def test_eventually_async_probe_awaited_until_it_stops_raising() -> None:
    calls: list[int] = []

    async def probe() -> str:
        calls.append(1)
        assert len(calls) >= 3, "not yet"
        return "ready"

    assert await eventually(probe, interval=0.001) == "ready"
    assert len(calls) == 3


async def test_eventually_assertion_style_probe_passing_returns_none() -> None:
    seen: list[int] = []

    def probe() -> None:
        seen.append(1)
        assert len(seen) == 2

    await eventually(probe, interval=0.001)
    assert len(seen) == 2


async def test_eventually_never_true_reraises_last_assertion_within_the_call_bound() -> None:
    calls: list[int] = []

    def probe() -> None:
        calls.append(1)
        raise AssertionError(f"call {len(calls)}")

    with pytest.raises(AssertionError, match=r"^call \d+$") as err:
        await eventually(probe, timeout=0.05, interval=0.01)
    assert 1 <= len(calls) <= 0.05 / 0.01 + 1
    assert str(err.value) == f"call {len(calls)}"


async def test_eventually_falsy_until_timeout_raises_naming_the_probe() -> None:
    def nothing_yet() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"nothing_yet did not hold within 0\.02s"):
        await eventually(nothing_yet, timeout=0.02, interval=0.01)
