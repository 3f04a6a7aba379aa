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

    expected = r"nothing_yet did not hold within 0\.02s \(last answer False\)"
    with pytest.raises(AssertionError, match=expected):
        await eventually(nothing_yet, timeout=0.02, interval=0.01)


class Counter:
    """A probe that is not ready until its ``ready_at``-th call, then answers that call's number."""

    def __init__(self, ready_at: int) -> None:
        self.ready_at, self.calls = ready_at, 0

    def plain(self) -> int:
        self.calls += 1
        return self.calls if self.calls >= self.ready_at else 0

    async def coroutine(self) -> int:
        return self.plain()

    def asserting(self) -> int:
        self.calls += 1
        assert self.calls >= self.ready_at, f"call {self.calls} is too early"
        return self.calls


@pytest.mark.parametrize("kind", ["plain", "coroutine", "asserting"])
async def test_eventually_probe_ready_on_third_call_returns_its_value(kind: str) -> None:
    probe = Counter(ready_at=3)
    assert await eventually(getattr(probe, kind), interval=0.001) == 3
    assert probe.calls == 3


async def test_eventually_probe_ready_at_once_is_asked_once() -> None:
    probe = Counter(ready_at=1)
    assert await eventually(probe.plain, timeout=0) == 1
    assert probe.calls == 1


async def test_eventually_other_exception_propagates_at_once() -> None:
    calls = []

    def broken() -> bool:
        calls.append(1)
        raise KeyError("engine-0")

    with pytest.raises(KeyError):
        await eventually(broken, timeout=5)
    assert calls == [1]
