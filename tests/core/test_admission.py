"""The admission queue: priority, then fair turns between tenants, then FIFO."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.core.admission import AdmissionQueue, Waiter


def w(priority: int, tenant: str, name: str, since: float = 0.0) -> Waiter[str]:
    return Waiter(priority, tenant, since, name)


def drain(q: AdmissionQueue[str]) -> list[str]:
    out = []
    while (x := q.pop()) is not None:
        out.append(x.payload)
    return out


def test_admission_lower_priority_value_first() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(10)
    for item in (w(0, "t", "normal"), w(5, "t", "batch"), w(-1, "t", "urgent")):
        assert q.push(item)
    assert drain(q) == ["urgent", "normal", "batch"]


def test_admission_tenants_take_turns_fifo_within_each() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(100)
    for i in range(10):
        q.push(w(0, "big", f"big{i}"))
    q.push(w(0, "small", "small0"))
    q.push(w(0, "small", "small1"))
    order = drain(q)
    # The small tenant waits behind one of the big tenant's requests, not behind all ten.
    assert order[:4] == ["big0", "small0", "big1", "small1"]
    assert [x for x in order if x.startswith("big")] == [f"big{i}" for i in range(10)]


def test_admission_full_queue_refuses_and_keeps_its_contents() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(2)
    assert q.push(w(0, "a", "1")) and q.push(w(0, "a", "2"))
    assert not q.push(w(-5, "b", "3"))
    assert len(q) == 2 and drain(q) == ["1", "2"]


def test_admission_remove_client_gone_leaves_at_once() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(10)
    gone, stay = w(0, "a", "gone"), w(0, "a", "stay")
    q.push(gone)
    q.push(stay)
    assert q.remove(gone) and not q.remove(gone)
    assert drain(q) == ["stay"] and len(q) == 0 and q.depth() == {}


def test_admission_expire_returns_the_late_only() -> None:
    q: AdmissionQueue[str] = AdmissionQueue(10)
    q.push(w(0, "a", "old", since=0.0))
    q.push(w(1, "b", "new", since=9.0))
    assert [x.payload for x in q.expire(now=10.0, max_wait=5.0)] == ["old"]
    assert q.depth() == {1: 1}


@given(st.lists(st.tuples(st.integers(-2, 2), st.sampled_from("abc")), max_size=60))
def test_admission_pop_order_never_breaks_priority_or_tenant_fifo(
    items: list[tuple[int, str]],
) -> None:
    q: AdmissionQueue[int] = AdmissionQueue(1000)
    for i, (p, t) in enumerate(items):
        q.push(Waiter(p, t, 0.0, i))
    popped = []
    while (x := q.pop()) is not None:
        popped.append(x)
    assert [x.priority for x in popped] == sorted(x.priority for x in popped)
    for t in "abc":
        for p in range(-2, 3):
            mine = [x.payload for x in popped if x.tenant == t and x.priority == p]
            assert mine == sorted(mine)
    assert len(popped) == len(items) and len(q) == 0
