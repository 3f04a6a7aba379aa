"""``kvrouter top`` in a real terminal: tmux runs it, ``send-keys`` types, ``capture-pane`` reads.

Two engine-sims (two models) behind a real ``kvrouter serve`` with an admin token; the test
waits for both engines' rows, cycles the sort and the model filter, and quits with ``q``. The
tmux server is the test's own (its own socket), killed at the end whatever happened.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.integration import ADMIN_ENV, ADMIN_TOKEN, MODEL
from tests.support import CHECKOUT_KVROUTER, Proc, http_json, running, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

OTHER_MODEL = "other-model"
TOKEN_ENV = "TOP_TEST_ADMIN_TOKEN"


class Terminal:
    """One tmux session on a private server, sized like a terminal."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"kvrouter-top-test-{os.getpid()}"
        # Only ``env``: nothing of the test runner's environment reaches the terminal's program.
        line = " ".join(
            ["env", "-i", *(f"{k}={shlex.quote(v)}" for k, v in env.items())]
            + [shlex.quote(c) for c in command]
        )
        self.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "30", line)

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "top").returncode == 0

    def kill(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Proc, list[Proc]]]:
    with running([]) as procs:
        engines = [
            start_kvrouter(["engine-sim", "--fast", "--model", m], tmp_path)
            for m in (MODEL, OTHER_MODEL)
        ]
        procs.extend(engines)
        args = ["serve", "--log-level", "warning"]
        for e in engines:
            args += ["--engine", e.url]
        router = start_kvrouter(args, tmp_path, ready_path="/ready", env=ADMIN_ENV)
        procs.append(router)
        wait_until(lambda: len(http_json(f"{router.url}/v1/models")["data"]) == 2, "both models")
        yield router, engines


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_top_in_tmux_shows_every_engine_sorts_filters_and_quits(
    fleet: tuple[Proc, list[Proc]],
) -> None:
    router, (sim, other) = fleet
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    http_json(f"{router.url}/v1/chat/completions", body)
    command = [*CHECKOUT_KVROUTER, "top", router.url, "--interval", "0.5"]
    command += ["--admin-token-env", TOKEN_ENV]
    env = {TOKEN_ENV: ADMIN_TOKEN, "PATH": os.environ.get("PATH", ""), "TERM": "xterm-256color"}
    term = Terminal(command, env)
    try:

        def rows() -> list[str]:
            return [line for line in term.screen().splitlines() if "healthy" in line]

        wait_until(lambda: len(rows()) == 2, "both engines' rows on the screen", timeout=30)
        assert {line.split()[0] for line in rows()} == {sim.url, other.url}, term.screen()
        assert "policy kv-aware" in term.screen()
        assert "req/s" in term.screen()

        term.keys("s")
        wait_until(lambda: "sort: inflight" in term.screen(), "the sort moved on")
        term.keys("m")
        wait_until(lambda: "model: other-model (1 of 2" in term.screen(), "the model filter")
        assert [line.split()[0] for line in rows()] == [other.url]
        term.keys("m")
        wait_until(lambda: "model: sim-model (1 of 2" in term.screen(), "the next model")
        assert [line.split()[0] for line in rows()] == [sim.url]

        term.keys("q")
        wait_until(lambda: not term.alive(), "top quit on q", timeout=10)
    finally:
        term.kill()


def test_top_refuses_a_bad_url_with_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", "top", "localhost:8000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not an http(s) URL: localhost:8000" in done.stderr
