"""The LRU key set and the block index with its deltas."""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.lru import EVICT_BATCH_DIVISOR, LruKeys
from router.core.seq import SeqWindow


def test_lru_touch_over_capacity_evicts_least_recent() -> None:
    lru = LruKeys(capacity=EVICT_BATCH_DIVISOR * 2)
    lru.touch(range(EVICT_BATCH_DIVISOR * 2), now=0.0)
    lru.touch([0], now=1.0)  # 0 is now the most recent
    evicted = lru.touch([10_000], now=2.0)
    assert 0 not in evicted and 1 in evicted
    assert len(lru) <= lru.capacity


def test_lru_leading_stops_at_first_missing() -> None:
    lru = LruKeys(10)
    lru.touch_chain([1, 2], now=0.0)
    assert lru.leading([1, 2, 3, 4]) == 2
    assert lru.leading([9, 1]) == 0


def test_lru_expire_drops_entries_older_than_ttl() -> None:
    lru = LruKeys(10, ttl=5.0)
    lru.touch([1], now=0.0)
    lru.touch([2], now=4.0)
    assert lru.leading([1], now=6.0) == 0  # stale entries do not count even before expiry
    assert lru.expire(now=6.0) == [1]
    assert list(lru) == [2]


@given(ops=st.lists(st.lists(st.integers(0, 50), max_size=8), max_size=60), cap=st.integers(1, 20))
def test_lru_never_exceeds_capacity(ops: list[list[int]], cap: int) -> None:
    lru = LruKeys(cap)
    for t, keys in enumerate(ops):
        lru.touch(keys, float(t))
        assert len(lru) <= cap


def index(capacity: int = 1000, max_entries: int = 100_000, origin: str = "a") -> BlockIndex:
    return BlockIndex(IndexLimits(capacity, None, max_entries), origin)


def test_index_overlaps_counts_leading_blocks_per_engine() -> None:
    idx = index()
    idx.confirm("e1", [1, 2, 3], now=0.0)
    idx.confirm("e2", [1, 2], now=0.0)
    idx.confirm("e3", [7], now=0.0)
    assert idx.overlaps([1, 2, 3, 4], ["e1", "e2", "e3", "unknown"]) == [3, 2, 0, 0]
    assert [idx.overlap(e, [1, 2, 3, 4]) for e in ("e1", "e2", "e3", "unknown")] == [3, 2, 0, 0]
    assert idx.overlap("e1", []) == 0


def test_index_capacity_forgets_tail_before_head() -> None:
    cap = EVICT_BATCH_DIVISOR
    idx = index(capacity=cap)
    chain = list(range(1, cap + 1))
    idx.confirm("e", chain, now=0.0)
    idx.confirm("e", [10_000 + i for i in range(cap // 2)], now=1.0)
    # The head of the old chain was touched last within it, so it survives longest.
    assert idx.overlaps(chain, ["e"])[0] > 0
    assert len(idx) <= cap


def test_index_confirm_keeps_the_recency_predict_gave() -> None:
    cap = EVICT_BATCH_DIVISOR
    idx = index(capacity=cap)
    early, late = [1, 2, 3], [4, 5, 6]
    idx.predict("e", early, now=0.0)  # admitted first...
    idx.confirm("e", late, now=1.0)
    delta = idx.confirm("e", early, now=2.0)  # ...answered last: still the older of the two
    assert delta.added == tuple(early) and delta.engine == "e"
    idx.confirm("e", [100 + i for i in range(cap - 4)], now=3.0)  # the cap takes 3 blocks
    assert idx.overlaps(early, ["e"]) == [0]
    assert idx.overlaps(late, ["e"]) == [3]


def test_index_confirm_puts_back_what_left_since_predict() -> None:
    idx = index()
    idx.predict("e", [1, 2, 3], now=0.0)
    idx.withdraw("e", [2, 3])  # a failed attempt took back its claims meanwhile
    idx.confirm("e", [1, 2, 3], now=1.0)
    assert idx.overlaps([1, 2, 3], ["e"]) == [3]


def test_index_global_cap_bounds_entries() -> None:
    idx = index(capacity=10_000, max_entries=1_000)
    for e in range(5):
        idx.confirm(f"e{e}", [e * 100_000 + i for i in range(600)], now=float(e))
    assert len(idx) <= 1_000
    assert len(idx) == sum(idx.blocks(e) for e in idx.engines)


def test_index_drop_engine_forgets_its_entries() -> None:
    idx = index()
    idx.confirm("e1", [1, 2], now=0.0)
    idx.drop_engine("e1")
    assert len(idx) == 0 and idx.overlaps([1], ["e1"]) == [0]


def test_index_apply_duplicate_delta_is_ignored() -> None:
    src, dst = index(origin="a"), index(origin="b")
    d = src.confirm("e", [1, 2], now=0.0)
    assert dst.apply(d, now=0.0) is True
    assert dst.apply(d, now=0.0) is False
    assert dst.overlaps([1, 2], ["e"]) == [2]


def test_index_apply_remove_and_clear() -> None:
    dst = index(origin="b")
    dst.apply(Delta("a", 1, "e", added=(1, 2, 3)), now=0.0)
    dst.apply(Delta("a", 2, "e", removed=(2,)), now=0.0)
    assert dst.overlaps([1, 2, 3], ["e"]) == [1]
    dst.apply(Delta("a", 3, "e", cleared=True), now=0.0)
    assert len(dst) == 0


def routed(idx: BlockIndex, engine: str, keys: list[int]) -> Delta:
    """What an answered request leaves: its prediction, confirmed (keys need not be a chain)."""
    idx.predict(engine, keys, 0.0)
    return idx.confirm(engine, keys, 0.0)


@settings(max_examples=50)
@given(seed=st.integers(0, 2**32 - 1), dup=st.integers(0, 10))
def test_index_any_delivery_order_and_duplication_converges(seed: int, dup: int) -> None:
    rng = random.Random(seed)
    src = index(origin="a")
    deltas = [
        routed(src, f"e{rng.randrange(3)}", [rng.randrange(40) for _ in range(4)])
        for _ in range(20)
    ]
    deliveries = deltas + [rng.choice(deltas) for _ in range(dup)]
    rng.shuffle(deliveries)
    dst = index(origin="b")
    for d in deliveries:
        dst.apply(d, now=0.0)
    for e in ("e0", "e1", "e2"):
        assert set(dst._engines[e]) == set(src._engines[e]) if e in src.engines else True
    assert dst.seen() == {"a": 20}


def test_seq_window_bounded_skips_old_gap() -> None:
    w = SeqWindow(limit=8)
    for s in range(2, 12):  # seq 1 never arrives
        assert w.add(s)
    assert w.floor >= 2 and len(w.above) <= 8
    assert not w.add(1)  # given up on: a late arrival is treated as seen


def test_index_memory_per_entry_is_bounded() -> None:
    # The bench measures this at 1M entries; here a smaller sample guards the order of size.
    idx = index(capacity=200_000, max_entries=10**7)
    rng = random.Random(1)
    tracemalloc.start()
    try:
        for i in range(1000):
            # Keys are made inside the measurement: the index keeps the objects alive.
            chain = [rng.getrandbits(64) for _ in range(100)]
            idx.confirm(f"e{i % 8}", chain, now=float(i))
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert used / len(idx) < 160


@given(held=st.integers(0, 300), total=st.integers(0, 300), ttl=st.sampled_from([None, 10.0]))
def test_lru_leading_galloping_matches_walk(held: int, total: int, ttl: float | None) -> None:
    keys = list(range(1, total + 1))
    lru = LruKeys(1000, ttl=ttl)
    lru.touch_chain(keys[:held], now=5.0)
    expected = min(held, total)
    assert lru.leading(keys) == expected
    assert lru.leading(keys, now=6.0) == expected
    if ttl is not None:
        assert lru.leading(keys, now=100.0) == 0


def test_lru_evicted_age_is_the_newest_of_what_new_keys_would_push_out() -> None:
    lru = LruKeys(4)
    lru.touch([1], 10.0)
    lru.touch([2], 20.0)
    lru.touch([3], 30.0)
    assert lru.evicted_age(1, 100.0) is None  # room for one more: nothing evicted
    assert lru.evicted_age(2, 100.0) == 90.0  # key 1 goes
    assert lru.evicted_age(3, 100.0) == 80.0  # keys 1 and 2: the newest of them was used at 20
    assert lru.evicted_age(10, 100.0) == 70.0  # everything goes, key 3 last
    assert len(lru) == 3  # a question, not an eviction
    lru.clear()  # an emptied cache given more than it holds (a prompt past its size)
    assert lru.evicted_age(10, 100.0) is None
