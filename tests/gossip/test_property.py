"""Property tests: any delivery order, duplication and loss converges to the same index.

Deltas here commute (keys added, and removals of keys no delta adds), which is what routing
produces; the index decides how conflicting deltas merge, not the gossip layer.
"""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.core.index import BlockIndex, IndexLimits
from router.core.load import LoadBook
from router.gateway.replicas.delegate import IndexDelegate, run_origin
from router.gateway.replicas.in_process import Fleet
from router.gossip.config import LOCAL
from router.gossip.transport import Faults
from router.gossip.wire import pb

LIMITS = IndexLimits(engine_capacity_blocks=1 << 16)
ENGINES = ("e0", "e1", "e2")
BASELINE = {e: list(range(i * 1000, i * 1000 + 20)) for i, e in enumerate(ENGINES)}

# One op: (origin number, engine, added keys, removed baseline keys).
op = st.tuples(
    st.integers(0, 2),
    st.sampled_from(ENGINES),
    st.lists(st.integers(10_000, 10_200), max_size=6),
    st.lists(st.integers(0, 19), max_size=3),
)


def _index(name: str) -> BlockIndex:
    idx = BlockIndex(LIMITS, origin=run_origin(name))
    for engine, keys in BASELINE.items():
        idx.restore_keys(engine, keys, 0.0)
    return idx


def _produce(ops: list[tuple[int, str, list[int], list[int]]]) -> list[pb.Delta]:
    """The deltas three origins make for ``ops``, through their own indexes and bridges."""
    sources = [_index(f"src{i}") for i in range(3)]
    bridges = [IndexDelegate(s, LoadBook()) for s in sources]
    for origin, engine, added, removed in ops:
        src = sources[origin]
        base = BASELINE[engine]
        if added:
            bridges[origin].queue(src.confirm(engine, added, 0.0))
        if removed:
            bridges[origin].queue(src.remove(engine, [base[i] for i in removed]))
    return [d for b in bridges for d in b.local_deltas(10_000)]


def _expected(ops: list[tuple[int, str, list[int], list[int]]]) -> dict[str, frozenset[int]]:
    held = {e: set(keys) for e, keys in BASELINE.items()}
    for _, engine, _added, removed in ops:
        held[engine] -= {BASELINE[engine][i] for i in removed}
    for _, engine, added, _ in ops:
        held[engine] |= set(added)
    return {e: frozenset(k) for e, k in held.items() if k}


def _contents(idx: BlockIndex) -> dict[str, frozenset[int]]:
    return {e: frozenset(idx.export_keys(e)) for e in idx.engines if idx.blocks(e)}


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=25), data=st.data())
def test_merge_any_order_with_duplicates_same_index(ops, data) -> None:
    deltas = _produce(ops)
    order = data.draw(st.permutations(deltas), label="order")
    dupes = data.draw(st.lists(st.sampled_from(deltas), max_size=10) if deltas else st.just([]))
    dst = _index("dst")
    bridge = IndexDelegate(dst, LoadBook())
    for delta in [*order, *dupes]:
        bridge.merge_delta(delta)
    assert _contents(dst) == _expected(ops)
    in_order = _index("ref")
    for delta in deltas:
        IndexDelegate(in_order, LoadBook()).merge_delta(delta)
    assert dict(dst.seen()) == dict(in_order.seen())


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    replicas=st.integers(2, 5),
    writes=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.sampled_from(ENGINES),
            st.lists(st.integers(0, 500), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=20,
    ),
    loss=st.sampled_from([0.0, 0.1, 0.3]),
    duplicate=st.sampled_from([0.0, 0.2]),
    jitter=st.sampled_from([0.0, 0.005, 0.02]),
    seed=st.integers(0, 2**16),
)
def test_fleet_faulty_network_every_replica_same_index(
    replicas, writes, loss, duplicate, jitter, seed
) -> None:
    async def run() -> None:
        faults = Faults(loss=loss, duplicate=duplicate, latency=(0.0, jitter))
        fleet = Fleet(tuning=dataclasses.replace(LOCAL), faults=faults, seed=seed)
        try:
            rs = await fleet.start(replicas)
            want: dict[str, set[int]] = {}
            for who, engine, keys in writes:
                rs[who % replicas].record(engine, keys)
                want.setdefault(engine, set()).update(keys)
                await fleet.clock.advance(0.003)  # type: ignore[attr-defined]
            frozen = {e: frozenset(k) for e, k in want.items()}
            done = await fleet.settle(lambda: all(r.contents() == frozen for r in rs), limit=20.0)
            assert done, [r.contents() for r in rs]
        finally:
            await fleet.close()

    asyncio.run(run())
