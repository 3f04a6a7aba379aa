"""The compiled hot loops against their pure-Python reference, bit for bit.

Each property drives two instances (or calls) through the same random operations, one with the
compiled extension and one under ``reference()`` (``router.core.hotpath.native`` set to None,
which every caller reads at call time), and asserts identical results and identical state:
block keys, walk depths, LRU order and times, claims, shortlists and routing decisions.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core import hotpath
from router.core.blocks import RoutingText, block_keys, token_keys
from router.core.decision import RoutingCore
from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.lru import Lru, LruKeys, lru_keys
from router.core.policy import Policy, load_policy_text
from router.core.predictions import Predictions
from router.core.ring import under_cap
from router.core.shortlist import narrow, shortlist
from router.core.simulator import Fleet, simulate_policy
from router.core.workload import SyntheticSpec, synthetic
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.core.test_simulator import SPEC
from tests.support import ROOT

T = TypeVar("T")

COMPILED = hotpath.native
needs_compiled = pytest.mark.skipif(
    COMPILED is None, reason="the compiled extension is not built here"
)


@contextmanager
def reference() -> Iterator[None]:
    """Run the pure-Python reference inside the block."""
    saved = hotpath.native
    hotpath.native = None
    try:
        yield
    finally:
        hotpath.native = saved


def both(fn: Callable[[], T]) -> tuple[T, T]:
    """``fn()`` compiled, then as the reference."""
    fast = fn()
    with reference():
        slow = fn()
    return fast, slow


def test_compiled_extension_is_built_where_a_compiler_exists() -> None:
    # An editable or wheel install compiles it with the machine's C compiler; a silent
    # fallback on a machine that has one would hide a broken build.
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine: the reference runs")
    assert hotpath.compiled(), "router.core._hotpath did not build: run `pip install -e .`"


# -- block keys ------------------------------------------------------------------------------

TEXT = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=300),
    st.text(max_size=300),  # any code point, lone surrogates included
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(-3, 40), st.text(max_size=8))
def test_block_keys_of_text_identical(text: str, block_chars: int, namespace: str) -> None:
    rt = RoutingText(namespace or "m", text=text)
    fast, slow = both(lambda: _or_error(lambda: block_keys(rt, block_chars)))
    assert fast == slow


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**40), 2**40), max_size=200), st.integers(-2, 9), st.text(max_size=4)
)
def test_token_keys_identical(ids: list[int], block_size: int, lora: str) -> None:
    fast, slow = both(lambda: _or_error(lambda: token_keys(ids, block_size, lora or None)))
    assert fast == slow
    rt = RoutingText("m", token_ids=ids)
    assert _or_error(lambda: block_keys(rt, block_size * 4)) == _in_reference(
        lambda: _or_error(lambda: block_keys(rt, block_size * 4))
    )


def _or_error(fn: Callable[[], T]) -> T | str:
    try:
        return fn()
    except ValueError as exc:
        return type(exc).__name__


def _in_reference(fn: Callable[[], T]) -> T:
    with reference():
        return fn()


# -- the LRU and the index -------------------------------------------------------------------

KEY = st.integers(0, 40)
CHAIN = st.lists(KEY, max_size=12, unique=True)
OP = st.one_of(
    st.tuples(st.just("touch"), st.lists(KEY, max_size=12)),
    st.tuples(st.just("chain"), CHAIN),
    st.tuples(st.just("discard"), st.lists(KEY, max_size=6)),
    st.tuples(st.just("evict"), st.integers(0, 5)),
    st.tuples(st.just("expire"), st.just(0)),
    st.tuples(st.just("leading"), CHAIN),
    st.tuples(st.just("clear"), st.just(0)),
)


def _lru_step(lru: Lru, op: str, arg: Any, now: float) -> object:
    if op == "touch":
        return lru.touch(arg, now)
    if op == "chain":
        return lru.touch_chain(arg, now)
    if op == "discard":
        return lru.discard(iter(arg))
    if op == "evict":
        return lru.evict(arg)
    if op == "expire":
        return lru.expire(now)
    if op == "leading":
        return (lru.leading(arg), lru.leading(arg, now), lru.leading_since(arg, now - 2))
    lru.clear()
    return None


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 30), st.sampled_from([None, 1.5, 4.0]), st.lists(OP, max_size=40))
def test_lru_identical_over_random_operations(
    capacity: int, ttl: float | None, ops: list[tuple[str, Any]]
) -> None:
    fast = lru_keys(capacity, ttl)
    with reference():
        slow = lru_keys(capacity, ttl)
    assert not isinstance(fast, LruKeys) and isinstance(slow, LruKeys)
    for step, (op, arg) in enumerate(ops):
        now = step * 0.5
        a = _lru_step(fast, op, arg, now)
        b = _lru_step(slow, op, arg, now)
        assert a == b, (step, op)
        assert fast.items() == slow.items()
        assert (len(fast), list(fast)) == (len(slow), list(slow))
        assert fast.evicted_age(capacity // 2 + 1, now) == slow.evicted_age(capacity // 2 + 1, now)


@needs_compiled
@pytest.mark.parametrize("ttl", [None, 30.0])
def test_lru_identical_at_scale(ttl: float | None) -> None:
    # Hypothesis' small sets rarely grow the compiled table or compact its log more than a
    # few times: thousands of chains of 64-bit keys, re-touched, discarded and expired, do.
    rng = random.Random(7)
    pool = [rng.getrandbits(64) for _ in range(3000)]
    fast = lru_keys(500, ttl)
    with reference():
        slow = lru_keys(500, ttl)
    for step in range(3000):
        now = step * 0.1
        start = rng.randrange(len(pool) - 64)
        chain = pool[start : start + rng.randint(1, 64)]
        roll = rng.random()
        a: object
        b: object
        if roll < 0.6:
            a, b = fast.touch_chain(chain, now), slow.touch_chain(chain, now)
        elif roll < 0.75:
            a, b = fast.discard(chain[::3]), slow.discard(chain[::3])
        elif roll < 0.85:
            a, b = fast.expire(now), slow.expire(now)
        elif roll < 0.95:
            a = (fast.leading(chain, now), fast.leading_since(chain, now - 5))
            b = (slow.leading(chain, now), slow.leading_since(chain, now - 5))
        else:
            count = rng.randint(0, 40)
            a = (fast.evicted_age(200, now), fast.evict(count))
            b = (slow.evicted_age(200, now), slow.evict(count))
        assert a == b, step
        if step % 100 == 0:
            assert fast.items() == slow.items(), step
    assert fast.items() == slow.items()


@needs_compiled
def test_compiled_lru_refuses_keys_outside_64_bits_and_keeps_its_state() -> None:
    lru = lru_keys(10)
    lru.touch_chain([1, 2, 3], 1.0)
    for bad in ([4, -1], [2**64], [5, "x"]):
        with pytest.raises((OverflowError, TypeError)):
            lru.touch(bad, 2.0)  # type: ignore[arg-type]
        assert lru.items() == [(3, 1.0), (2, 1.0), (1, 1.0)]
    # Asked about, such keys are simply not held.
    assert -1 not in lru and 2**64 not in lru and "x" not in lru
    assert lru.leading([-1, 1]) == 0 and lru.leading([3, 2**64, 1]) == 1
    assert lru.discard([-1, 2, 2**70]) == [2] and len(lru) == 2
    assert lru.leading_since([3, -5], 0.0) == 1


ENGINES = ["e0", "e1", "e2", "e3", "e4"]
INDEX_OP: st.SearchStrategy[tuple[str, str, list[int]]] = st.one_of(
    st.tuples(st.sampled_from(["predict", "confirm", "withdraw", "remove", "store"]),
              st.sampled_from(ENGINES), CHAIN),
    st.tuples(st.sampled_from(["clear", "drop", "add"]), st.sampled_from(ENGINES), st.just([])),
    st.tuples(st.just("apply"), st.sampled_from(ENGINES), CHAIN),
    st.tuples(st.just("overlaps"), st.just(""), CHAIN),
)  # fmt: skip


def _index_step(idx: BlockIndex, op: str, engine: str, keys: list[int], now: float) -> object:
    if op == "predict":
        idx.predict(engine, keys, now)
        return None
    if op == "confirm":
        return idx.confirm(engine, keys, now).added
    if op == "withdraw":
        idx.withdraw(engine, keys)
        return None
    if op == "remove":
        return idx.remove(engine, keys).removed
    if op == "store":
        idx.store(engine, keys, "gpu", now)
        return None
    if op == "clear":
        return idx.clear(engine).cleared
    if op == "drop":
        idx.drop_engine(engine)
        return None
    if op == "add":
        idx.add_engine(engine, 7)
        return None
    if op == "apply":
        return idx.apply(Delta("peer", int(now * 2), engine, added=tuple(keys)), now)
    return (idx.overlaps(keys, [*ENGINES, "unknown"], now), idx.overlaps(keys, ENGINES))


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.integers(4, 40), st.sampled_from([None, 2.0]), st.integers(10, 200), st.lists(INDEX_OP))
def test_index_identical_over_random_events(
    capacity: int, ttl: float | None, cap: int, ops: list[tuple[str, str, list[int]]]
) -> None:
    limits = IndexLimits(engine_capacity_blocks=capacity, ttl_seconds=ttl, max_entries=cap)
    fast, slow = BlockIndex(limits), BlockIndex(limits)
    for step, (op, engine, keys) in enumerate(ops):
        now = step * 0.5
        a = _index_step(fast, op, engine, keys, now)
        with reference():
            b = _index_step(slow, op, engine, keys, now)
        assert a == b, (step, op)
        assert len(fast) == len(slow)
        for e in ENGINES:
            assert fast.export_keys(e) == slow.export_keys(e)


CLAIM_OP = st.tuples(
    st.sampled_from(["claim", "confirm", "withdraw", "claimed"]), st.sampled_from(ENGINES), CHAIN
)


def _claim_step(p: Predictions, op: str, engine: str, keys: list[int]) -> object:
    if op == "claim":
        p.claim(engine, keys)
        return None
    if op == "confirm":
        p.confirm(engine, keys)
        return None
    if op == "withdraw":
        return p.withdraw(engine, keys)
    return sorted(p.claimed(engine, keys))


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(CLAIM_OP, max_size=40))
def test_claims_identical(ops: list[tuple[str, str, list[int]]]) -> None:
    fast, slow = Predictions(), Predictions()
    for op, engine, keys in ops:
        a = _claim_step(fast, op, engine, keys)
        with reference():
            b = _claim_step(slow, op, engine, keys)
        assert a == b
        # Every count, in the same order.
        assert [list(t.items()) for t in fast._claims.values()] == [
            list(t.items()) for t in slow._claims.values()
        ]


# -- the shortlist ---------------------------------------------------------------------------


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 3), st.booleans()), min_size=1, max_size=40
    ),
    st.one_of(st.none(), st.integers(0, 45)),
    st.integers(0, 2**64 - 1),
)
def test_shortlist_identical(
    rows: list[tuple[int, int, bool]], session: int | None, ring_key: int
) -> None:
    cands = [f"e{i}" for i in range(len(rows))]
    overlaps, requests, eligible = (list(col) for col in zip(*rows, strict=True))
    session_engine = None if session is None else f"e{session}"

    def home(key: int, admit: Callable[[str], bool]) -> str | None:
        ok = [e for e in cands if admit(e)]
        return ok[key % len(ok)] if ok else None

    fast, slow = both(
        lambda: shortlist(cands, overlaps, requests, eligible, session_engine, ring_key, home)
    )
    assert fast == slow


def test_shortlist_past_64_bits_uses_the_reference() -> None:
    cands = ["a", "b", "c"]
    kept = shortlist(cands, [0, 0, 0], [2**70, 1, 0], [True] * 3, None, 0, lambda k, a: None)
    assert kept == [0, 1, 2]


# -- decisions -------------------------------------------------------------------------------

PROMPT = st.lists(st.sampled_from(["alpha ", "beta ", "gamma ", "delta "]), max_size=60).map(
    "".join
)
REQUEST = st.tuples(PROMPT, st.booleans(), st.booleans())  # prompt, answered, released


def small_kv_aware(ttl: int) -> Policy:
    """kv-aware with blocks of 16 characters, caches of 16 blocks and ``ttl`` (0: none), so
    that short prompts span many blocks and evictions and expiry come often."""
    text = preset_path("kv-aware").read_text()
    for old, new in (
        ("block_chars: 512", "block_chars: 16"),
        ("engine_capacity_tokens: 1000000", "engine_capacity_tokens: 64"),
        ("ttl_seconds: 0", f"ttl_seconds: {ttl}"),
    ):
        assert old in text
        text = text.replace(old, new)
    return load_policy_text(text, "kv-aware-small")


def _decide_all(
    requests: list[tuple[str, bool, bool]], engines: int, policy: Policy
) -> list[object]:
    core = RoutingCore(policy)
    names = [f"http://engine-{i}:8000" for i in range(engines)]
    core.set_engines(dict.fromkeys(names, 1))
    seen: list[object] = []
    held = []
    for step, (prompt, answered, released) in enumerate(requests):
        now = float(step)
        d = core.decide({"model": "m", "prompt": prompt}, names, now)
        seen.append((d.engine, d.fallbacks, d.keys, d.totals, d.predicted))
        assert d.engine is not None
        lease = core.acquire(d, d.engine, now)
        if answered:
            seen.append(core.record(lease, now))
        if released:
            core.release(lease)
        else:
            held.append(lease)
    for lease in held:
        core.release(lease)
    seen.append([core.index.export_keys(e) for e in names])
    return seen


@needs_compiled
@settings(max_examples=100, deadline=None)
@given(st.lists(REQUEST, max_size=30), st.sampled_from([3, 16, 40]), st.sampled_from([0, 4]))
def test_decisions_identical(
    requests: list[tuple[str, bool, bool]], engines: int, ttl: int
) -> None:
    policy = small_kv_aware(ttl)
    fast, slow = both(lambda: _decide_all(requests, engines, policy))
    assert fast == slow


@needs_compiled
def test_simulated_trace_routes_every_request_to_the_same_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picks: list[str | None] = []
    decide = RoutingCore.decide

    def recording(self: RoutingCore, *args: Any, **kwargs: Any) -> Any:
        d = decide(self, *args, **kwargs)
        picks.append(d.engine)
        return d

    monkeypatch.setattr(RoutingCore, "decide", recording)
    trace = list(synthetic(SyntheticSpec(requests=400, conversations=40)))
    policy = load_policy(preset_path("kv-aware"))
    fast = simulate_policy(policy, trace, Fleet(16, SPEC))
    compiled_picks = picks[:]
    picks.clear()
    with reference():
        slow = simulate_policy(policy, trace, Fleet(16, SPEC))
    assert len(compiled_picks) == len(trace)
    assert compiled_picks == picks
    assert fast == slow


# -- the fallback ----------------------------------------------------------------------------

# Keys of one prompt, and whether the compiled code made them, in a fresh interpreter.
PROBE = (
    "import json, sys\n"
    "{block}"
    "from router.core import hotpath\n"
    "from router.core.blocks import RoutingText, block_keys\n"
    "keys = block_keys(RoutingText('m', text='x' * 2000), 512)\n"
    "print(json.dumps({{'compiled': hotpath.compiled(), 'keys': keys}}))\n"
)


def _probe(env: dict[str, str], block: bool = False) -> tuple[dict[str, Any], str]:
    # Blocking the module in sys.modules is what a missing build looks like to the import.
    code = PROBE.format(block="sys.modules['router.core._hotpath'] = None\n" if block else "")
    res = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert res.returncode == 0, res.stderr
    found: dict[str, Any] = json.loads(res.stdout)
    return found, res.stderr


def test_fallback_forced_by_the_environment_runs_the_reference_silently() -> None:
    found, stderr = _probe({hotpath.PURE_PYTHON_VARIABLE: "1"})
    assert found["compiled"] is False
    assert found["keys"] == block_keys(RoutingText("m", text="x" * 2000), 512)
    assert "CompiledMissingWarning" not in stderr


def test_fallback_without_the_extension_warns_once_how_to_get_it() -> None:
    found, stderr = _probe({hotpath.PURE_PYTHON_VARIABLE: "0"}, block=True)
    assert found["compiled"] is False
    assert found["keys"] == block_keys(RoutingText("m", text="x" * 2000), 512)
    assert stderr.count("CompiledMissingWarning") == 1
    assert "C compiler" in stderr and hotpath.PURE_PYTHON_VARIABLE in stderr


@needs_compiled
def test_compiled_by_default() -> None:
    found, stderr = _probe({hotpath.PURE_PYTHON_VARIABLE: ""})
    assert found["compiled"] is True
    assert "CompiledMissingWarning" not in stderr


# -- the fleet-wide passes around the shortlist ------------------------------------------------


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.booleans()), max_size=30))
def test_narrow_identical(rows: list[tuple[int, int, bool]]) -> None:
    cands = [f"e{i}" for i in range(len(rows))]
    overlaps = [o for o, _, _ in rows]
    requests = [r for _, r, _ in rows]
    eligible = [e for _, _, e in rows]
    keep = [i for i, (o, r, _) in enumerate(rows) if o or r % 3 == 0]
    fast, slow = both(lambda: narrow(keep, cands, overlaps, requests, eligible))
    assert fast == slow


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-5, 2**70), max_size=30),
    st.integers(1, 2**66),
    st.floats(0.0, 3.0),
    st.integers(0, 9),
)
def test_under_cap_identical(loads: list[int], weight: int, epsilon: float, min_cap: int) -> None:
    fast, slow = both(lambda: under_cap(loads, weight, epsilon, min_cap))
    assert fast == slow
