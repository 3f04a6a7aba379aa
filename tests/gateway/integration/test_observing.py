"""Observing a real ``kvrouter serve`` in front of real engine-sims: the access log it writes
on standard error, the routing-quality counters against the engines' own ``/stats``, and the
divergence point of a conversation whose client rewrites an early message every turn."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from router.core.blocks import routing_text
from router.presets import preset_path
from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import (
    Proc,
    http_json,
    metric,
    metrics_text,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
BLOCK_CHARS = 512  # the kv-aware preset's
SYSTEM = " ".join(f"rule{i} answer in full sentences and cite the source" for i in range(60))
MARKER = "PROMPT-MARKER-91c2"


@dataclass
class Fleet:
    engines: list[Proc]
    router: Proc

    def send(self, body: dict[str, Any], request_id: str, session: str | None = None) -> None:
        """POST ``body`` to the chat route and read the answer (streamed or not) to its end."""
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if session is not None:
            headers["x-session-id"] = session
        data = json.dumps(body).encode()
        req = urllib.request.Request(f"{self.router.url}{CHAT}", data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=20) as r:
            assert r.status == 200
            r.read()

    def access_log(self) -> list[dict[str, Any]]:
        """The access-log records the router has written so far."""
        out = []
        for line in self.router.log().splitlines():
            if line.startswith("{") and '"request_id"' in line:
                out.append(json.loads(line))
        return out

    def record(self, request_id: str) -> dict[str, Any]:
        """The one access-log record of ``request_id`` (written once the answer has ended)."""
        found: list[dict[str, Any]] = []

        def written() -> bool:
            found[:] = [r for r in self.access_log() if r["request_id"] == request_id]
            return bool(found)

        wait_until(written, f"the access-log line of {request_id}")
        assert len(found) == 1
        return found[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("observing")
    with running([]) as procs:
        engines = [start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2)]
        procs.extend(engines)
        policy = tmp / "policy.yaml"
        shutil.copyfile(preset_path("kv-aware"), policy)
        args = ["serve", "--policy", str(policy), "--host", "127.0.0.1"]
        for e in engines:
            args += ["--backend", e.url]
        router = start_kvrouter(args, tmp, env=ADMIN_ENV)
        procs.append(router)
        wait_until(lambda: readiness(router)["healthy_backends"] == 2, "both engines healthy")
        yield Fleet(engines, router)
        assert router.stop() == 0


def chat(messages: list[dict[str, str]], stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 4}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def turn_messages(note: str, turns: int) -> list[dict[str, str]]:
    """A conversation of ``turns`` questions whose early message is ``note``."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": note}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"answer {t} " * 80})
        messages.append({"role": "user", "content": f"question {t} about the rules " * 20})
    return messages


def first_changed_block(before: dict[str, Any], after: dict[str, Any]) -> int:
    """The first block of ``after``'s routing text that differs from ``before``'s."""
    a, b = routing_text(before).text, routing_text(after).text
    assert a is not None and b is not None
    at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return at // BLOCK_CHARS


def test_rewritten_early_message_each_turn_names_the_rewritten_block(fleet: Fleet) -> None:
    bodies = []
    for turn in range(1, 4):
        # The client rewrites its early note (a date line) and adds the next question.
        body = chat(turn_messages(f"note: this is turn {turn} of the day", turn))
        fleet.send(body, f"rw-{turn}", session="conv-rw")
        bodies.append(body)
    rewritten = first_changed_block(bodies[0], bodies[1])
    assert rewritten == first_changed_block(bodies[1], bodies[2]) > 0
    assert fleet.record("rw-1")["prefix_broken_at"] is None  # no previous turn
    for turn in (2, 3):
        line = fleet.record(f"rw-{turn}")
        assert line["prefix_broken_at"] == {
            "block": rewritten,
            "char_offset": rewritten * BLOCK_CHARS,
        }
        assert line["divergence_block"] == rewritten
    # The next turn as /debug/route sees it: its prefix leaves the fleet's at the same block.
    probe = chat(turn_messages("note: this is turn 4 of the day", 4))
    route = http_json(f"{fleet.router.url}/debug/route", probe, ADMIN | {"x-session-id": "conv-rw"})
    broken = {"block": rewritten, "char_offset": rewritten * BLOCK_CHARS}
    assert route["prefix_broken_at"] == broken
    holders = route["divergence"].pop("holders")
    assert route["divergence"] == broken and holders


def test_conversation_that_only_extends_is_never_flagged(fleet: Fleet) -> None:
    for turn in range(1, 4):
        fleet.send(chat(turn_messages("note: a fixed line", turn)), f"ext-{turn}", "conv-ext")
    for turn in range(1, 4):
        assert fleet.record(f"ext-{turn}")["prefix_broken_at"] is None
    last = fleet.record("ext-3")
    assert last["believed"] > 0 and last["cached_tokens"] > 0


def engine_cached(fleet: Fleet) -> dict[str, int]:
    return {e.url: int(http_json(f"{e.url}/stats")["cached_tokens"]) for e in fleet.engines}


def achieved(fleet: Fleet) -> dict[str, float]:
    return {
        e.url: metric(fleet.router, "kvrouter_prefix_achieved_tokens_total", engine=e.url)
        for e in fleet.engines
    }


def test_achieved_tokens_are_what_the_engines_count_and_no_prompt_is_written(
    fleet: Fleet,
) -> None:
    stats0, counted0 = engine_cached(fleet), achieved(fleet)
    for i in range(12):
        doc = f"{MARKER} shared document {i % 3}. " + SYSTEM
        messages = [{"role": "user", "content": doc}, {"role": "user", "content": f"q{i}"}]
        fleet.send(chat(messages, stream=i % 2 == 0), f"ach-{i}")
    for i in range(12):
        fleet.record(f"ach-{i}")  # every answer has ended
    stats, counted = engine_cached(fleet), achieved(fleet)
    for url in stats:
        assert counted[url] - counted0[url] == stats[url] - stats0[url]
    assert sum(stats.values()) > sum(stats0.values())
    assert MARKER not in fleet.router.log()
    assert MARKER not in metrics_text(fleet.router)
