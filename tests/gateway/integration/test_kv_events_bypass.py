"""Traffic that bypasses the router: precise routing (KV events) finds it, approximate cannot.

The same seeded workload runs twice on fresh real processes on loopback (``engine-sim
--fast`` publishing KV events, ``kvrouter serve`` with kv-aware): once without KV events and
once with ``--kv-events`` for every engine. A fifth of the requests go straight to the engines,
round-robin, as clients that skip the router would: the first time each of a few documents is
asked. The router sees those only through the engines' events. Half way, one engine is reset
(its cache emptied, ``AllBlocksCleared`` published). The hit ratio compared is the engines'
own (``GET /stats``: cached over prompt tokens, counters read before the reset added in).
Requests go one at a time; every wait is bounded and nothing asserts on durations.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from router.presets import preset_text
from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import (
    Proc,
    free_port,
    free_ports,
    http_json,
    metric,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

ENGINES = 3
DOCUMENTS = 15
ASKED = 4  # times each document is asked; its first time bypasses for BYPASSED of them
BYPASSED = 12  # 12 of 60 requests: a fifth of the traffic
CAPACITY_TOKENS = 8_000  # about eight documents per engine
SEED = 7
CONFIG = """
health: {interval_seconds: 0.3, timeout_seconds: 2}
engines: {kv_events: {tokenize_timeout_seconds: 5}}
"""


def document(n: int) -> str:
    return " ".join(f"document {n} clause {i} says the terms hold as written" for i in range(40))


def body(doc: int, turn: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": document(doc)},
            {"role": "user", "content": f"question {turn} about document {doc}"},
        ],
        "max_tokens": 2,
    }


def workload(seed: int) -> list[tuple[dict[str, Any], int | None]]:
    """(body, engine index when it bypasses the router) in order; the same for one seed."""
    rng = random.Random(seed)
    bypassed = set(rng.sample(range(DOCUMENTS), BYPASSED))
    out: list[tuple[dict[str, Any], int | None]] = []
    sent_straight = 0
    for turn in range(ASKED):
        order = list(range(DOCUMENTS))
        rng.shuffle(order)
        for doc in order:
            target = None
            if turn == 0 and doc in bypassed:
                target = sent_straight % ENGINES
                sent_straight += 1
            out.append((body(doc, turn), target))
    return out


def held_by_event(router: Proc, b: dict[str, Any], engine: Proc) -> bool:
    got = http_json(f"{router.url}/debug/route", b, ADMIN)
    c = next(c for c in got["candidates"] if c["engine"] == engine.url)
    return bool(c["overlap_source"] == "event" and c["overlap_blocks"] > 0)


def engine_hit_ratio(
    tmp: Path,
    work: Sequence[tuple[dict[str, Any], int | None]],
    precise: bool,
    ports: Sequence[int],
) -> float:
    """The engines' hit ratio over ``work``; engine ``i`` listens on ``ports[i]``."""
    tmp.mkdir()
    with running([]) as procs:
        engines: list[Proc] = []
        events: list[str] = []
        for port in ports:
            pub, replay = free_port(), free_port()
            args = ["engine-sim", "--fast", "--kv-capacity-tokens", str(CAPACITY_TOKENS)]
            args += ["--kv-events-port", str(pub), "--kv-events-replay-port", str(replay)]
            engines.append(start_kvrouter(args, tmp, port=port))
            procs.append(engines[-1])
            events.append(f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}")
        policy = tmp / "policy.yaml"
        policy.write_text(
            preset_text("kv-aware", {"index.engine_capacity_tokens": CAPACITY_TOKENS})
        )
        config = tmp / "serve.yaml"
        config.write_text(CONFIG)
        args = ["serve", "--config", str(config), "--policy", str(policy), "--host", "127.0.0.1"]
        for e, ev in zip(engines, events, strict=True):
            args += ["--backend", e.url]
            if precise:
                args += ["--kv-events", f"{e.url}={ev}"]
        router = start_kvrouter(args, tmp, env=ADMIN_ENV)
        procs.append(router)
        wait_until(lambda: readiness(router)["healthy_backends"] == ENGINES, "healthy")
        before_reset: dict[str, Any] = {}
        for i, (b, target) in enumerate(work):
            if i == len(work) // 2:
                before_reset = http_json(f"{engines[0].url}/stats")
                http_json(f"{engines[0].url}/reset", {})
                if precise:
                    wait_until(
                        lambda: (
                            metric(router, "kvrouter_kv_events_total", type="AllBlocksCleared") >= 1
                        ),
                        "the router hears the reset",
                    )
            if target is None:
                http_json(f"{router.url}/v1/chat/completions", b)
                continue
            http_json(f"{engines[target].url}/v1/chat/completions", b)
            if precise:  # only so the comparison does not depend on how fast events travel
                e = engines[target]
                wait_until(lambda b=b, e=e: held_by_event(router, b, e), "the bypass event")  # type: ignore[misc]
        stats = [http_json(f"{e.url}/stats") for e in engines]
        if precise:
            assert metric(router, "kvrouter_kv_events_degraded_backends") == 0
            assert metric(router, "kvrouter_tokenize_failures_total") == 0
        for p in procs:
            assert "Traceback" not in p.log()
    assert sum(s["requests"] for s in stats) + before_reset["requests"] == len(work)
    prompt = sum(s["prompt_tokens"] for s in stats) + before_reset["prompt_tokens"]
    cached = sum(s["cached_tokens"] for s in stats) + before_reset["cached_tokens"]
    return float(cached / prompt)


def test_precise_routing_hits_more_than_approximate_with_bypass_traffic(tmp_path: Path) -> None:
    work = workload(SEED)
    assert sum(1 for _, target in work if target is not None) * 5 == len(work)
    # The same engine URLs both times: the ring places a prefix nobody holds by its engines'
    # names, so fresh ports would give each run a different placement and the two ratios
    # would differ by the ports' luck as much as by the events.
    ports = free_ports(ENGINES)
    approximate = engine_hit_ratio(tmp_path / "approximate", work, precise=False, ports=ports)
    precise = engine_hit_ratio(tmp_path / "precise", work, precise=True, ports=ports)
    assert precise > approximate, (precise, approximate)
