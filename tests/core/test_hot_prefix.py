"""Hot prefixes: copied to another engine once their holders carry too many of their requests."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from router.core.decision import Lease, RoutingCore
from router.core.engine_model import EngineSpec
from router.core.load import Load
from router.core.policy import HotPrefix, Policy, PolicyError, load_policy_text
from router.core.simulator import Fleet, simulate_policy
from router.core.workload import HotspotSpec, SyntheticSpec, hotspot
from router.presets import preset_path
from router.yaml_files import load_policy

ENGINES = ["a", "b", "c", "d"]
DOC = "a long document everyone asks about, sentence after sentence " * 60  # ~3,600 chars
# The holder always wins on overlap (1.0 against at most 0.1 of load) unless the prefix is hot.
SCORERS = "scorers: [{type: prefix-overlap, weight: 1}, {type: load, weight: 0.1}]\n"


def core(spread_above: float) -> RoutingCore:
    hot = f"hot_prefix: {{spread_above: {spread_above}}}\n" if spread_above else ""
    r = RoutingCore(load_policy_text("name: t\n" + SCORERS + hot, "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def ask(r: RoutingCore, i: int, now: float) -> tuple[str, Lease, int]:
    """A question about DOC, answered (its lease still held): engine, lease, spread blocks."""
    d = r.decide({"model": "m", "prompt": DOC + f" question {i}?"}, ENGINES, now)
    assert d.engine is not None
    lease = r.acquire(d, d.engine, now)
    r.record(lease, now)
    return d.engine, lease, d.explain()["spread_blocks"]


def test_hot_prefix_stays_on_its_holder_without_spreading() -> None:
    r = core(0)
    placed = [ask(r, i, float(i)) for i in range(9)]
    assert len({engine for engine, _, _ in placed}) == 1
    assert all(spread == 0 for _, _, spread in placed)


def test_hot_prefix_copied_once_its_holders_carry_more_than_spread_above() -> None:
    r = core(2)
    placed = [ask(r, i, float(i)) for i in range(9)]
    first = placed[0][0]
    # The first request made the prefix (nobody held it: no heat); the next three found it
    # held by one engine with 0, 1, then 2 of its requests in flight: not above 2.
    assert [e for e, _, _ in placed[:4]] == [first] * 4
    assert all(spread == 0 for _, _, spread in placed[:4])
    assert placed[4][0] != first and placed[4][2] > 0  # 3 in flight on one holder: copied
    assert placed[5][2] == 0  # two holders with 4 in flight: 2 each, not above
    per_engine = Counter(engine for engine, _, _ in placed)
    assert per_engine[first] == 4 and len(per_engine) == 4  # copies on every engine by now


def test_hot_prefix_heat_leaves_with_the_requests() -> None:
    r = core(1)
    leases = [ask(r, i, float(i))[1] for i in range(6)]
    holders = {lease.engine for lease in leases}
    assert len(holders) > 1
    for lease in leases:
        r.release(lease)
    assert r.outstanding == 0
    # Nothing in flight: the prefix is not hot, and goes to one of the engines holding it.
    engine, lease, spread = ask(r, 99, 10.0)
    assert spread == 0 and engine in holders
    r.release(lease)


def test_hot_prefix_heat_of_peer_replicas_counts() -> None:
    """Each replica routes a share of a prefix's requests; their gossiped heat adds to its
    own, so a fleet of replicas spreads at the same heat as one router would."""
    r = core(2)
    first, made, _ = ask(r, 0, 0.0)  # made the prefix: nobody held it, no heat
    again, lease, _ = ask(r, 1, 1.0)  # one request in flight behind it, here
    assert again == first and lease.prefix is not None
    r.loads.peer_report("peer", {first: Load(2, 0)}, {lease.prefix: 2})  # 1 + 2: above 2 per holder
    hot = r.decide({"model": "m", "prompt": DOC + " question 2?"}, ENGINES, 2.0)
    assert hot.engine != first and hot.explain()["spread_blocks"] > 0
    r.loads.forget_peer("peer")
    assert r.decide({"model": "m", "prompt": DOC + " question 3?"}, ENGINES, 3.0).engine == first
    r.release(made)
    r.release(lease)


def test_hot_prefix_setting_is_checked() -> None:
    base = "name: t\n" + SCORERS
    assert load_policy_text(base, "t").hot_prefix.spread_above == 0
    assert (
        load_policy_text(base + "hot_prefix: {spread_above: 1.5}\n", "t").hot_prefix.spread_above
        == 1.5
    )
    with pytest.raises(PolicyError, match=r"hot_prefix.spread_above"):
        load_policy_text(base + "hot_prefix: {spread_above: -1}\n", "t")
    with pytest.raises(PolicyError, match=r"hot_prefix.spread: unknown field"):
        load_policy_text(base + "hot_prefix: {spread: 1}\n", "t")
    keep = "hot_prefix: {spread_above: 2, keep_younger_than_seconds: 30}\n"
    assert load_policy_text(base + keep, "t").hot_prefix.keep_younger_than_seconds == 30
    with pytest.raises(PolicyError, match=r"hot_prefix.keep_younger_than_seconds"):
        load_policy_text(base + "hot_prefix: {keep_younger_than_seconds: -1}\n", "t")


def test_hot_prefix_copied_only_where_it_evicts_nothing_still_in_use() -> None:
    # Caches of 16 blocks (2,048 tokens): DOC's copy (7 blocks) evicts from a full cache.
    small = "index: {engine_capacity_tokens: 2048}\n"
    hot = "hot_prefix: {spread_above: 2, keep_younger_than_seconds: 60}\n"
    r = RoutingCore(load_policy_text("name: t\n" + SCORERS + hot + small, "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    filler = [r.keys_of({"model": "m", "prompt": f"{e} other {i} " * 1000})[1] for i, e in
              enumerate(ENGINES)]  # fmt: skip
    for e, keys in zip(ENGINES, filler, strict=True):
        # d's cache was last used 1000 s ago; the others are in use now.
        r.index.confirm(e, keys, 0.0 if e == "d" else 1000.0)
    assert r.index.evicted_age("b", 7, 1000.0) == 0.0
    assert r.index.evicted_age("d", 7, 1000.0) == 1000.0
    r.index.confirm("a", r.keys_of({"model": "m", "prompt": DOC})[1], 1000.0)  # a holds DOC
    placed = [ask(r, i, 1000.0 + i / 100) for i in range(12)]
    engines = {e for e, _, _ in placed}
    assert placed[0][0] == "a"
    assert "d" in engines  # copied where it evicts what nobody used for 1000 s
    assert not engines & {"b", "c"}  # never where it would push out prompts in use


def test_hot_prefix_evens_out_the_fleet_on_a_viral_document() -> None:
    """The simulator's viral document: without spreading, the engines holding it carry its
    long answers; spreading evens the busy time out at the same hit ratio."""
    trace = list(hotspot(HotspotSpec(chat=SyntheticSpec(requests=1200, rate_per_s=8.0))))
    fleet = Fleet(8, EngineSpec(capacity_tokens=400_000), report_interval=0.5)
    shipped = load_policy(preset_path("kv-aware"))
    assert shipped.hot_prefix.spread_above > 0
    held = simulate_policy(_without_spreading(shipped), trace, fleet)
    spread = simulate_policy(shipped, trace, fleet)
    assert spread.load_imbalance < held.load_imbalance
    assert spread.hit_ratio >= 0.98 * held.hit_ratio


def _without_spreading(policy: Policy) -> Policy:
    return replace(policy, name="no-spread", hot_prefix=HotPrefix())
