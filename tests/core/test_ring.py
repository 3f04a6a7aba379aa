"""Consistent hashing with bounded loads."""

from __future__ import annotations

import random

import pytest
from uhashring import HashRing

from router.core.ring import BoundedLoadRing, _hash, load_cap, under_cap


def ring_of(n: int) -> BoundedLoadRing:
    r = BoundedLoadRing()
    r.set_engines({f"e{i}": 1 for i in range(n)})
    return r


def test_ring_walk_visits_every_engine_once() -> None:
    r = ring_of(7)
    walk = list(r.walk(12345))
    assert sorted(walk) == sorted(f"e{i}" for i in range(7))


def test_ring_walk_is_uhashrings_order_after_changes() -> None:
    """Replicas of any version must place a new prefix alike: the walk is uhashring's own
    (a ring built at once from the final engines), also after engines come, go and reweigh."""
    rng = random.Random(3)
    r = BoundedLoadRing()
    r.set_engines({f"e{i}": 1 for i in range(12)})
    r.set_engines({**{f"e{i}": 1 for i in range(3, 12)}, "e5": 2, "new": 1})
    final = {**{f"e{i}": 1 for i in range(3, 12)}, "e5": 2, "new": 1}
    nodes = {e: {"weight": w, "vnodes": r.vnodes} for e, w in final.items()}
    reference = HashRing(nodes=nodes, hash_fn=_hash, vnodes=r.vnodes)
    for key in [rng.getrandbits(64) for _ in range(300)] + [0, (1 << 64) - 1]:
        assert list(r.walk(key)) == list(reference.iterate_nodes(key))
    assert list(BoundedLoadRing().walk(7)) == []


@pytest.mark.parametrize("n", [4, 8, 16])
def test_ring_adding_one_engine_moves_about_one_nth_of_keys(n: int) -> None:
    rng = random.Random(n)
    keys = [rng.getrandbits(64) for _ in range(20_000)]
    before = ring_of(n)
    after = ring_of(n + 1)
    moved = sum(before.home(k) != after.home(k) for k in keys) / len(keys)
    expected = 1 / (n + 1)
    assert expected * 0.6 < moved < expected * 1.5


@pytest.mark.parametrize("n", [4, 8])
def test_ring_removing_one_engine_moves_only_its_keys(n: int) -> None:
    rng = random.Random(n)
    keys = [rng.getrandbits(64) for _ in range(10_000)]
    full = ring_of(n)
    smaller = ring_of(n)
    smaller.set_engines({f"e{i}": 1 for i in range(n - 1)})
    for k in keys:
        if full.home(k) != f"e{n - 1}":
            assert smaller.home(k) == full.home(k)


def test_ring_hot_key_never_exceeds_cap() -> None:
    # Adversarial stream: every request has the same key; the walk must spill past full engines.
    n, eps = 8, 0.25
    r = ring_of(n)
    loads = dict.fromkeys(r.engines, 0)
    for _ in range(400):
        cap = load_cap(sum(loads.values()), n, eps)

        def under_cap(e: str, cap: float = cap) -> bool:
            return loads[e] + 1 <= cap

        home = r.home(42, under_cap)
        assert home is not None
        loads[home] += 1
        assert max(loads.values()) <= cap
    assert max(loads.values()) <= load_cap(400 - 1, n, eps)


def test_ring_weights_skew_share() -> None:
    r = BoundedLoadRing()
    r.set_engines({"big": 3, "small": 1})
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(8000)]
    big = sum(r.home(k) == "big" for k in keys) / len(keys)
    assert 0.65 < big < 0.85


def test_ring_empty_has_no_home() -> None:
    assert BoundedLoadRing().home(1) is None


def test_load_cap_least_loaded_always_admissible() -> None:
    for total in range(0, 50):
        for n in (1, 2, 3, 8):
            cap = load_cap(total, n, 0.0)
            assert total // n + 1 <= cap


@pytest.mark.parametrize(
    ("loads", "weight", "epsilon", "min_cap", "expected"),
    [
        pytest.param([], 1, 0.25, 0, [], id="no-engines"),
        pytest.param([0, 0, 0, 0], 1, 0.25, 0, [True] * 4, id="idle-all-admitted"),
        pytest.param([4, 0, 0, 0], 1, 0.25, 0, [False, True, True, True], id="busy-one-over"),
        pytest.param([4, 0, 0, 0], 1, 0.25, 5, [True] * 4, id="min-cap-admits-light-load"),
        pytest.param([900, 1000], 500, 0.0, 0, [True, False], id="least-loaded-always-in"),
    ],
)
def test_under_cap_bounded_load_filter(
    loads: list[int], weight: int, epsilon: float, min_cap: int, expected: list[bool]
) -> None:
    assert under_cap(loads, weight, epsilon, min_cap) == expected
