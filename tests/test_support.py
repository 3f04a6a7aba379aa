"""What tests.support holds beyond plumbing, tested: ``eventually``."""

from __future__ import annotations

import pytest

from tests.support import eventually


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
    assert await eventually(getattr(probe, kind), interval=0) == 3
    assert probe.calls == 3


async def test_eventually_probe_ready_at_once_is_asked_once() -> None:
    probe = Counter(ready_at=1)
    assert await eventually(probe.plain, timeout=0) == 1
    assert probe.calls == 1


async def test_eventually_assertion_never_holds_raises_the_last_one() -> None:
    probe = Counter(ready_at=10**9)
    with pytest.raises(AssertionError, match=r"call \d+ is too early") as raised:
        await eventually(probe.asserting, timeout=0.05, interval=0.01)
    assert f"call {probe.calls} is too early" in str(raised.value)
    assert probe.calls >= 2  # asked more than once, and stopped


async def test_eventually_falsy_until_timeout_raises_assertion_naming_the_value() -> None:
    with pytest.raises(AssertionError, match=r"still \[\] after 0.02 s"):
        await eventually(list, timeout=0.02, interval=0.01)


async def test_eventually_other_exception_propagates_at_once() -> None:
    calls = []

    def broken() -> bool:
        calls.append(1)
        raise KeyError("engine-0")

    with pytest.raises(KeyError):
        await eventually(broken, timeout=5)
    assert calls == [1]
