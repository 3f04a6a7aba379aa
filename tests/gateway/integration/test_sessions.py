"""Sessions as agents send them, through ``kvrouter serve`` and real engine-sims.

A coding agent's session header keeps its conversation on one engine turn after turn; the
bounded-load filter still moves it once that engine is over the cap (session affinity is a
scorer, never a way past the load guard), and the conversation then stays where it went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.gateway.integration.test_gateway import assert_inflight_zero
from tests.support import Proc, http_json, readiness, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

POLICY = """
name: sessions
cold_prefix: score
filters:
  - type: bounded-load
    epsilon: 0.5
    metric: requests
scorers:
  - type: session-affinity
    weight: 10
  - type: load
    weight: 1
"""
CONFIG = """
policy: {policy}
engine_metrics: {{interval_seconds: 0.1, timeout_seconds: 1}}
"""
SESSION = {"X-Claude-Code-Session-Id": "4f1c2a9e-session-of-one-agent"}


def turn(history: list[dict[str, str]], i: int) -> dict[str, Any]:
    history.append({"role": "user", "content": f"turn {i}: edit file {i} and run the tests"})
    return {"model": MODEL, "messages": list(history), "max_tokens": 2}


def served(engines: list[Proc]) -> list[int]:
    return [http_json(f"{e.url}/stats")["requests"] for e in engines]


def send(router: Proc, engines: list[Proc], body: dict[str, Any]) -> Proc:
    """Send one turn with the session header; the engine that served it."""
    before = served(engines)
    http_json(f"{router.url}/v1/chat/completions", body, SESSION)
    after = served(engines)
    (i,) = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
    return engines[i]


def test_session_header_keeps_a_conversation_on_one_engine_until_the_cap_moves_it(
    tmp_path: Path, procs: list[Proc]
) -> None:
    engines = [start_kvrouter(["engine-sim", "--fast"], tmp_path) for _ in range(3)]
    procs.extend(engines)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG.format(policy=policy))
    args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
    for e in engines:
        args += ["--engine", e.url]
    router = start_kvrouter(args, tmp_path, env=ADMIN_ENV)
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] == 3, "all engines healthy")

    history: list[dict[str, str]] = []
    home = {send(router, engines, turn(history, i)).url for i in range(5)}
    assert len(home) == 1, "one session, one engine"
    (first,) = home

    # The session's engine says it queues other clients' work: over the bounded-load cap.
    http_json(f"{first}/load", {"waiting": 50})
    probe = turn(list(history), 99)

    def routed_elsewhere() -> bool:
        got = http_json(f"{router.url}/debug/route", probe, {**ADMIN, **SESSION})
        return bool(got["engine"] != first)

    wait_until(routed_elsewhere, "the load guard moves the session off its full engine")
    moved = send(router, engines, turn(history, 5))
    assert moved.url != first

    # The engine is free again; the conversation stays where its last turn was answered.
    http_json(f"{first}/load", {"waiting": 0})

    def eligible_again() -> bool:
        got = http_json(f"{router.url}/debug/route", probe, {**ADMIN, **SESSION})
        return any(c["engine"] == first and c["eligible"] for c in got["candidates"])

    wait_until(eligible_again, "the freed engine is under the cap again")
    again = {send(router, engines, turn(history, i)).url for i in range(6, 9)}
    assert again == {moved.url}
    assert_inflight_zero(router)
