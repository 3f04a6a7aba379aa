"""Precise routing end to end: engine-sims publishing KV events into a real ``kvrouter serve``.

Everything runs as real processes on loopback with free ports. The router's ``/debug/route``
(admin) says where a request would go and where each candidate's overlap came from; loops
are bounded and nothing asserts on durations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import (
    Proc,
    free_port,
    http_json,
    metric,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

CONFIG = """
policy: kv-aware
health: {interval_seconds: 0.3, timeout_seconds: 2}
"""


def body(tag: str) -> dict[str, Any]:
    system = " ".join(f"{tag} rule {i} keep answers short and exact" for i in range(40))
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }


class Fleet:
    def __init__(self, tmp: Path, procs: list[Proc]) -> None:
        self.tmp, self.procs = tmp, procs
        self.engines: list[Proc] = []
        self.events: dict[str, str] = {}
        for _ in range(2):
            pub, replay = free_port(), free_port()
            args = ["engine-sim", "--fast", "--kv-events-port", str(pub)]
            args += ["--kv-events-replay-port", str(replay), "--block-tokens", "16"]
            e = start_kvrouter(args, tmp)
            procs.append(e)
            self.engines.append(e)
            self.events[e.url] = f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"
        self.router = self.start_router()

    def start_router(self) -> Proc:
        config = self.tmp / "serve.yaml"
        config.write_text(CONFIG)
        args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
        for e in self.engines:
            args += ["--backend", e.url, "--kv-events", f"{e.url}={self.events[e.url]}"]
        router = start_kvrouter(args, self.tmp, env=ADMIN_ENV)
        self.procs.append(router)
        wait_until(lambda: readiness(router)["healthy_backends"] == 2, "healthy")
        return router

    def route(self, b: dict[str, Any], router: Proc | None = None) -> dict[str, Any]:
        got: dict[str, Any] = http_json(f"{(router or self.router).url}/debug/route", b, ADMIN)
        return got

    def candidate(self, b: dict[str, Any], engine: Proc, router: Proc | None = None) -> Any:
        got = self.route(b, router)
        return next(c for c in got["candidates"] if c["engine"] == engine.url)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running([]) as procs:
        f = Fleet(tmp_path_factory.mktemp("kv-events"), procs)
        yield f
        for p in procs:
            assert "Traceback" not in p.log()


def held_by_events(
    fleet: Fleet, b: dict[str, Any], engine: Proc, router: Proc | None = None
) -> bool:
    c = fleet.candidate(b, engine, router)
    return bool(c["overlap_source"] == "event" and c["overlap_blocks"] > 0)


def test_bypass_traffic_routes_the_next_request_to_that_engine(fleet: Fleet) -> None:
    b = body("bypass")
    for target in fleet.engines:  # whichever engine took it straight, the router follows
        tagged = body(f"bypass-{target.port}")
        http_json(f"{target.url}/v1/chat/completions", tagged)
        wait_until(lambda t=target, b=tagged: held_by_events(fleet, b, t), "its event")  # type: ignore[misc]
        got = fleet.route(tagged)
        assert got["engine"] == target.url
        other = next(c for c in got["candidates"] if c["engine"] != target.url)
        assert other["overlap_blocks"] == 0
        before = http_json(f"{target.url}/stats")["requests"]
        answer = http_json(f"{fleet.router.url}/v1/chat/completions", tagged)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert http_json(f"{target.url}/stats")["requests"] == before + 1
    assert fleet.route(b)["candidates"][0]["overlap_source"] == "none"
    assert metric(fleet.router, "kvrouter_kv_events_total", type="BlockStored") >= 2
    assert metric(fleet.router, "kvrouter_index_entries", source="event") > 0


def test_late_replica_knows_what_engines_hold_without_requests(fleet: Fleet) -> None:
    b = body("late")
    target = fleet.engines[1]
    http_json(f"{target.url}/v1/chat/completions", b)
    wait_until(lambda: held_by_events(fleet, b, target), "the first router sees it")
    late = fleet.start_router()
    wait_until(lambda: held_by_events(fleet, b, target, late), "the late router replays it")
    assert fleet.route(b, late)["engine"] == target.url
    assert metric(late, "kvrouter_requests_total") == 0
    assert metric(late, "kvrouter_kv_event_replays_total") >= 1


def test_engine_reset_clears_its_entries(fleet: Fleet) -> None:
    b = body("reset")
    target = fleet.engines[0]
    http_json(f"{target.url}/v1/chat/completions", b)
    wait_until(lambda: held_by_events(fleet, b, target), "the engine's event")
    http_json(f"{target.url}/reset", {})
    wait_until(lambda: fleet.candidate(b, target)["overlap_blocks"] == 0, "the clear arrives")
    assert fleet.candidate(b, target)["overlap_source"] == "none"
