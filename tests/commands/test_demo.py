"""``kvrouter demo --kv-events``: the bypass plan, and the mode end to end in reduced size."""

from __future__ import annotations

import re
import subprocess

import pytest

from router.commands.demo import _table
from router.commands.demo_kv_events import bypass_plan
from router.commands.demo_workload import ENGINES, PhaseResult
from tests.support import CHECKOUT_KVROUTER, ROOT

# Small enough to finish quickly on two cores, large enough that every engine and both kinds
# of traffic see requests on both sides of the reset.
REQUESTS = 80
RUN_TIMEOUT_SECONDS = 240


@pytest.mark.parametrize(
    ("share", "expected"),
    [(0.0, 0), (0.2, 0.2), (0.5, 0.5)],
    ids=["none", "a-fifth", "half"],
)
def test_bypass_plan_seeded_share_dealt_round_robin(share: float, expected: float) -> None:
    plan = bypass_plan(2000, share, seed=1)
    targets = [t for t in plan if t is not None]
    assert abs(len(targets) / len(plan) - expected) < 0.03
    assert targets == [i % ENGINES for i in range(len(targets))]
    assert plan == bypass_plan(2000, share, seed=1)


def test_demo_table_prints_reachable_and_achieved_over_prompt_tokens() -> None:
    counted = PhaseResult("kv-aware", requests=4, prompt_tokens=1000, cached_tokens=500)
    counted.quality = {"reachable": 800.0, "routed": 700.0, "achieved": 500.0}
    uncounted = PhaseResult("round-robin", requests=4, prompt_tokens=1000)
    out = _table([counted, uncounted])
    head = out.splitlines()[0].split()
    assert head[3:7] == ["hit", "ratio", "reachable", "achieved"]
    assert _row(out, "kv-aware")[3:6] == ["0.500", "0.800", "0.500"]
    assert _row(out, "round-robin")[4:6] == ["-", "-"]


def _row(out: str, routing: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if re.match(rf"{routing} +\d", line)]
    assert len(rows) == 1, out
    return rows[0]


@pytest.mark.integration
@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 30)
def test_demo_kv_events_prints_approximate_and_precise() -> None:
    res = subprocess.run(
        [*CHECKOUT_KVROUTER, "demo", "--kv-events", "--requests", str(REQUESTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    for routing in ("approximate", "precise"):
        # routing requests failed hit routed-hit bypass-hit p50 ms p99 ms req/s
        row = _row(res.stdout, routing)
        assert row[1:3] == [str(REQUESTS), "0"], res.stdout
        hits = [float(x) for x in row[3:6]]
        assert all(0.0 <= h <= 1.0 for h in hits), res.stdout
        assert hits[0] > 0.0 and hits[1] > 0.0, res.stdout  # shared system prompts reuse
        p50, p99 = float(row[6]), float(row[8])
        assert 0 < p50 <= p99, res.stdout
    events = re.search(r"received ([\d,]+) KV events", res.stdout)
    assert events is not None and int(events[1].replace(",", "")) > 0, res.stdout
