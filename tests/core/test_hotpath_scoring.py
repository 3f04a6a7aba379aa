"""The compiled scoring and ranking against their pure-Python reference, bit for bit.

The scorers' per-candidate arithmetic (ttft-estimate's costs, prefix-overlap's shares, the
falling scale the pricing scorers share), the weighted totals, the ranking of fallbacks and
the bounded-load cap run compiled (``router.core.hotpath``). Each property computes the same
thing both ways and compares every float by its bits (``float.hex``: -0.0 is not 0.0, and
NaN is NaN), errors included; the last ones drive whole routers through random requests and
engine reports under policies that use every scorer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.decision import RoutingCore
from router.core.load import EngineReport
from router.core.pickers import ranked
from router.core.policy import Policy, load_policy_text
from router.core.scorers import prefix_overlap, ttft_estimate
from router.core.scorers.base import Inputs, falling, weigh
from tests.core.test_hotpath import both, needs_compiled


def bits(value: Any) -> Any:
    """``value`` with every float spelled exactly, so that equal means bit for bit."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, list | tuple):
        return [bits(v) for v in value]
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    return value


def outcome(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or the name of the error it raised (the reference raises Python's)."""
    try:
        return bits(fn())
    except (ArithmeticError, ValueError) as exc:
        return type(exc).__name__


def same(fn: Callable[[], Any]) -> None:
    fast, slow = both(lambda: outcome(fn))
    assert fast == slow


# Mostly everyday figures; now and then one past 2**53 or 2**64, where the compiled code
# hands over to the reference.
FIGURE = st.one_of(st.integers(0, 50_000), st.integers(-(2**70), 2**70))
USAGE = st.one_of(st.floats(0.0, 1.2), st.sampled_from([0.0, 0.9, 1.0, 1.5]))


@st.composite
def inputs(draw: st.DrawFn) -> Inputs:
    n = draw(st.integers(0, 12))
    column = st.lists(FIGURE, min_size=n, max_size=n)
    credit = draw(st.sampled_from([0, 0, 3]))
    return Inputs(
        candidates=[f"e{i}" for i in range(n)],
        blocks=draw(st.integers(0, 64)),
        overlaps=draw(st.lists(st.integers(0, 64), min_size=n, max_size=n) | column),
        requests=draw(column),
        tokens=draw(column),
        session_engine=None,
        prompt_tokens=draw(FIGURE),
        block_tokens=draw(st.sampled_from([1, 16, 128])),
        waiting=draw(st.just(()) | st.lists(st.integers(0, 5), min_size=n, max_size=n)),
        kv_usage=draw(st.just(()) | st.lists(USAGE, min_size=n, max_size=n)),
        credit=credit,
        credited=draw(st.just(()) | st.lists(st.booleans(), min_size=n, max_size=n))
        if credit
        else (),
        token_scale=draw(st.sampled_from([1.0, 0.26, 2.5])),
    )


TTFT = st.builds(
    ttft_estimate.Params,
    wait_tokens=st.integers(0, 10_000_000),
    running_tokens=st.integers(0, 10_000_000),
    kv_pressure=st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.9, 1.0])),
)


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(inputs(), TTFT)
def test_ttft_estimate_identical(x: Inputs, p: ttft_estimate.Params) -> None:
    same(lambda: ttft_estimate.costs(p, x))
    same(lambda: ttft_estimate.score(p, x))


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(inputs())
def test_prefix_overlap_identical(x: Inputs) -> None:
    same(lambda: prefix_overlap.score(prefix_overlap.Params(), x))


NUMBER = st.one_of(
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.0, 2**53, 2**53 + 1]),
)


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(st.lists(NUMBER, max_size=12))
def test_falling_identical(costs: list[float]) -> None:
    same(lambda: falling(costs))


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 10).flatmap(
        lambda n: st.lists(
            st.tuples(
                st.floats(0.0, 1000.0) | st.just(0.0),
                st.lists(st.floats(allow_nan=True), min_size=n, max_size=n),
            ),
            max_size=5,
        ).map(lambda cols: (n, cols))
    )
)
def test_weigh_identical(case: tuple[int, list[tuple[float, list[float]]]]) -> None:
    n, cols = case
    same(lambda: weigh([w for w, _ in cols], [c for _, c in cols], n))


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1.0]),
            st.integers(0, 3) | st.integers(-(2**70), 2**70),
        ),
        max_size=20,
    ),
    st.booleans(),
)
def test_ranked_identical(rows: list[tuple[bool, float, int]], nan: bool) -> None:
    eligible = [e for e, _, _ in rows]
    totals = [t for _, t, _ in rows]
    requests = [r for _, _, r in rows]
    if nan and totals:
        totals[0] = float("nan")  # the compiled code leaves NaN's order to Python's sort
    same(lambda: ranked(eligible, totals, requests))


# -- whole decisions, every scorer ------------------------------------------------------------

EVERY_SCORER = """
name: every-scorer
block_chars: 16
filters: [{type: bounded-load, epsilon: 0.5, metric: METRIC, min_cap: 2}]
scorers:
  - {type: ttft-estimate, weight: 1.0, wait_tokens: 512, running_tokens: 64, kv_pressure: 0.8}
  - {type: prefix-overlap, weight: 0.7}
  - {type: prefill-cost, weight: 0.3}
  - {type: load, weight: 0.2, metric: tokens}
  - {type: session-affinity, weight: 0.5}
picker: max-score
hot_prefix: {spread_above: 1, keep_younger_than_seconds: 5}
index: {engine_capacity_tokens: 64, ttl_seconds: 0, max_entries: 100000}
"""

PROMPT = st.lists(st.sampled_from(["alpha ", "beta ", "gamma ", "delta "]), max_size=40).map(
    "".join
)
# A request (prompt, session, answered, released), or an engine's own report.
STEP = st.one_of(
    st.tuples(st.just("request"), PROMPT, st.sampled_from([None, "s1", "s2"]), st.booleans()),
    st.tuples(
        st.just("report"),
        st.integers(0, 39),
        st.tuples(st.integers(0, 8), st.integers(0, 4), USAGE),
        st.booleans(),
    ),
)


def every_scorer(metric: str) -> Policy:
    return load_policy_text(EVERY_SCORER.replace("METRIC", metric), "every-scorer")


def _route(steps: list[tuple[str, Any, Any, bool]], engines: int, policy: Policy) -> Any:
    core = RoutingCore(policy)
    names = [f"http://engine-{i}:8000" for i in range(engines)]
    core.set_engines(dict.fromkeys(names, 1))
    seen: list[Any] = []
    held = []
    for step, (kind, a, b, flag) in enumerate(steps):
        now = float(step)
        if kind == "report":
            running, waiting, usage = b
            report = EngineReport(running=running, waiting=waiting, kv_usage=usage)
            core.loads.engine_report(names[a % engines], report, now - 0.5)
            continue
        d = core.decide({"model": "m", "prompt": a}, names, now, session=b)
        seen.append((d.engine, d.fallbacks, d.totals, dict(d.scores), d.eligible))
        assert d.engine is not None
        lease = core.acquire(d, d.engine, now)
        seen.append(core.record(lease, now))
        if flag:
            core.release(lease)
        else:
            held.append(lease)
    for lease in held:
        core.release(lease)
    return bits(seen)


@needs_compiled
@settings(max_examples=100, deadline=None)
@given(
    st.lists(STEP, max_size=30),
    st.sampled_from([3, 16, 40]),
    st.sampled_from(["requests", "tokens"]),
)
def test_decisions_with_every_scorer_and_engine_reports_identical(
    steps: list[tuple[str, Any, Any, bool]], engines: int, metric: str
) -> None:
    policy = every_scorer(metric)
    fast, slow = both(lambda: _route(steps, engines, policy))
    assert fast == slow
