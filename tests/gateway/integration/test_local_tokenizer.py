"""Precise routing with a local tokenizer: ``serve --tokenizer PATH`` and engine-sims tokenizing
with the same model files, publishing KV events. No request costs a ``/tokenize`` round trip.

Real processes on loopback with free ports; the official ``openai`` client is the user.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.cli import main
from router.enginesim.model_files import write_tokenizer
from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import (
    CHECKOUT_KVROUTER,
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


def messages(tag: str) -> list[ChatCompletionMessageParam]:
    system = " ".join(f"{tag} rule {i} keep answers short and exact" for i in range(30))
    return [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]


class Fleet:
    def __init__(self, tmp: Path, procs: list[Proc]) -> None:
        self.model = write_tokenizer(tmp / "model")
        self.engines: list[Proc] = []
        self.events: dict[str, str] = {}  # engine URL -> its event endpoint
        args = ["serve", "--host", "127.0.0.1", "--policy", "kv-aware"]
        args += ["--tokenizer", str(self.model)]
        for _ in range(2):
            pub = free_port()
            sim = ["engine-sim", "--fast", "--block-tokens", "4", "--kv-events-port", str(pub)]
            e = start_kvrouter([*sim, "--tokenizer", str(self.model)], tmp)
            procs.append(e)
            self.engines.append(e)
            self.events[e.url] = f"tcp://127.0.0.1:{pub}"
            args += ["--backend", e.url, "--kv-events", f"{e.url}={self.events[e.url]}"]
        self.router = start_kvrouter(args, tmp, env=ADMIN_ENV)
        procs.append(self.router)
        wait_until(lambda: readiness(self.router)["healthy_backends"] == 2, "ready")

    def candidate(self, msgs: list[ChatCompletionMessageParam], engine: Proc) -> Any:
        body = {"model": MODEL, "messages": msgs}
        got = http_json(f"{self.router.url}/debug/route", body, ADMIN)
        return next(c for c in got["candidates"] if c["engine"] == engine.url), got["engine"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running([]) as procs:
        f = Fleet(tmp_path_factory.mktemp("local-tokenizer"), procs)
        yield f
        for p in procs:
            assert "Traceback" not in p.log()


def test_bypass_prefix_is_found_with_local_ids_and_no_round_trip(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.router.url}/v1", api_key="none", max_retries=0)
    for target in fleet.engines:
        msgs = messages(f"local-{target.port}")
        # A client that skips the router: the engine stores the prefix and says so.
        http_json(
            f"{target.url}/v1/chat/completions",
            {"model": MODEL, "messages": msgs, "max_tokens": 2},
        )

        def seen(t: Proc = target, m: list[ChatCompletionMessageParam] = msgs) -> bool:
            c, _ = fleet.candidate(m, t)
            return bool(c["overlap_source"] == "event" and c["overlap_blocks"] > 0)

        wait_until(seen, "the engine's event, matched by the router's own ids")
        _, chosen = fleet.candidate(msgs, target)
        assert chosen == target.url
        before = http_json(f"{target.url}/stats")["requests"]
        stream = client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in stream if c.usage is not None]
        assert usage and usage[-1].prompt_tokens_details is not None
        assert usage[-1].prompt_tokens_details.cached_tokens
        assert http_json(f"{target.url}/stats")["requests"] == before + 1
    for e in fleet.engines:
        assert http_json(f"{e.url}/stats")["tokenize_requests"] == 0
    assert metric(fleet.router, "kvrouter_tokenize_seconds_count") >= 2
    assert metric(fleet.router, "kvrouter_tokenize_failures_total") == 0


def test_a_long_prompt_held_whole_is_encoded_whole(fleet: Fleet) -> None:
    """Past PARTIAL_ABOVE characters the router encodes the start first, and all of it only
    when an engine holds that start: here one does, so the overlap covers the whole prompt."""
    target = fleet.engines[0]
    long = " ".join(f"long rule {i} keep answers short" for i in range(2600))  # ~73,000
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": long}]
    http_json(
        f"{target.url}/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 1}
    )

    def seen() -> bool:
        c, _ = fleet.candidate(msgs, target)
        return bool(c["overlap_source"] == "event" and c["overlap_blocks"] > 0)

    wait_until(seen, "the long prompt's events")
    got = http_json(f"{fleet.router.url}/debug/route", {"model": MODEL, "messages": msgs}, ADMIN)
    held = next(c for c in got["candidates"] if c["engine"] == target.url)
    assert got["engine"] == target.url
    assert held["overlap_blocks"] >= got["blocks"] - 2  # not just the first 16,384 characters


def test_the_wrong_tokenizer_is_warned_of(fleet: Fleet, tmp_path: Path) -> None:
    """Files of another model load fine and match nothing: the router compares them with an
    engine's /tokenize once it is precise, and says so in its log."""
    wrong = write_tokenizer(tmp_path / "other-model", corpus=["another model entirely"] * 50)
    target = fleet.engines[1]
    pub = fleet.events[target.url]
    args = ["serve", "--host", "127.0.0.1", "--backend", target.url, "--tokenizer", str(wrong)]
    router = start_kvrouter([*args, "--kv-events", f"{target.url}={pub}"], tmp_path)
    try:
        # Prompts of new first blocks: a late subscriber without replay keys an engine's
        # blocks only from a chain's root (it never saw the earlier blocks a chat template's
        # preamble would hang from), and the first of those makes the engine precise.
        for i in range(40):  # bounded
            body = {"model": MODEL, "prompt": f"{i} wrong tokenizer probe " * 8, "max_tokens": 1}
            http_json(f"{target.url}/v1/completions", body)
            if "POST /tokenize give different ids" in router.log():
                break
            time.sleep(0.5)
        assert "POST /tokenize give different ids for the same prompt" in router.log()
        assert target.url in router.log()
    finally:
        router.stop()


def test_a_tokenizer_that_is_not_there_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--backend", "http://127.0.0.1:1", "--kv-events-port", "5557"]
    assert main([*argv, "--tokenizer", ""]) == 2
    assert "--tokenizer: must be 'engine'" in capsys.readouterr().err
    assert main([*argv[:3], "--tokenizer", str(tmp_path)]) == 2  # no engine publishes events
    assert "token ids key only engines that publish KV events" in capsys.readouterr().err
    (tmp_path / "tokenizer.json").write_text("{}")
    cases = ((tmp_path / "absent", b"no tokenizer.json there"), (tmp_path, b"not a tokenizer file"))
    for path, reason in cases:
        args = [*CHECKOUT_KVROUTER, *argv, "--tokenizer", str(path), "--port", str(free_port())]
        gone = subprocess.run(args, capture_output=True, timeout=60, check=False)
        assert gone.returncode == 2
        assert reason in gone.stderr and b"Traceback" not in gone.stderr
