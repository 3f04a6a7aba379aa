"""Policy hot reload: content-hash polling, ConfigMap symlink swaps, bad files, SIGHUP.

The watcher runs on a manual clock: a poll happens when the test moves time past it, and a
watcher that must not poll is shown to have no timer at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from router.core.fields import MAX_YAML_BYTES
from router.core.policy import Policy, PolicyError, load_policy_text
from router.gateway.config.reload import PolicyWatcher, Result
from router.gossip.clock import ManualClock
from router.presets import preset_path

GOOD = preset_path("least-load").read_text()
OTHER = preset_path("round-robin").read_text()
BAD = "name: broken\nscorers:\n  - type: load\n    weight: lots\n"
INTERVAL = 2.0


class Recorder:
    def __init__(self) -> None:
        self.policies: list[Policy] = []
        self.results: list[Result] = []
        self._changed = asyncio.Event()

    def apply(self, p: Policy) -> None:
        self.policies.append(p)

    def result(self, r: Result) -> None:
        self.results.append(r)
        self._changed.set()

    async def settled(self, n: int) -> list[Result]:
        """The results once there are ``n`` (a reload parses in a worker thread)."""
        for _ in range(n):
            if len(self.results) >= n:
                break
            await self._changed.wait()
            self._changed.clear()
        return self.results


@dataclass
class Watched:
    """A policy file holding GOOD, its watcher on a manual clock, the initial policy loaded."""

    file: Path
    rec: Recorder
    clock: ManualClock
    watcher: PolicyWatcher
    initial: Policy
    sleeps: list[float]


def watched(tmp_path: Path, poll: bool = True) -> Watched:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec, clock, sleeps = Recorder(), ManualClock(), []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await clock.sleep(seconds)

    w = PolicyWatcher(f, rec.apply, rec.result, INTERVAL, poll, now=clock.now, sleep=sleep)
    return Watched(f, rec, clock, w, w.load_initial(), sleeps)


@pytest.fixture
def live(tmp_path: Path) -> Watched:
    return watched(tmp_path)


@pytest.fixture
async def running(live: Watched) -> AsyncIterator[Watched]:
    """``live`` with its watcher's loop running."""
    task = asyncio.create_task(live.watcher.run())
    await live.clock.advance(0)  # the loop reaches its first wait
    try:
        yield live
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_reload_unchanged_content_nothing(live: Watched) -> None:
    assert live.initial.name == "least-load"
    live.file.write_text(GOOD)  # rewritten, same bytes
    assert live.watcher.check() is None
    assert live.rec.results == []


def test_reload_changed_content_applies_new_policy(live: Watched) -> None:
    live.file.write_text(OTHER)
    assert live.watcher.check() == "success"
    assert [p.name for p in live.rec.policies] == ["round-robin"]


def test_reload_invalid_logged_once_old_policy_stays(
    live: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    w, f, rec = live.watcher, live.file, live.rec
    f.write_text(BAD)
    with caplog.at_level(logging.ERROR, logger="router.gateway.config.reload"):
        assert w.check() == "error"
        assert w.check() is None  # same bad content: not counted again
    assert rec.policies == [] and rec.results == ["error"]
    assert f"{f}: scorers[0].weight: must be a number" in caplog.text
    assert "the current policy stays" in caplog.text
    f.write_text(OTHER)
    assert w.check() == "success"


def test_reload_back_to_live_content_after_bad_one_is_quiet(live: Watched) -> None:
    w, f = live.watcher, live.file
    f.write_text(BAD)
    w.check()
    f.write_text(GOOD)  # the live policy again: nothing to swap
    assert w.check() is None
    f.write_text(BAD)  # the same bad content once more: counted again, it is news
    assert w.check() == "error"


def test_reload_missing_file_error_once(live: Watched, caplog: pytest.LogCaptureFixture) -> None:
    live.file.unlink()
    with caplog.at_level(logging.ERROR, logger="router.gateway.config.reload"):
        assert live.watcher.check() == "error"
        assert live.watcher.check() is None
    assert live.rec.results == ["error"]
    assert f"{live.file}: cannot read: No such file or directory" in caplog.text


def test_reload_force_reapplies_unchanged(live: Watched) -> None:
    assert live.watcher.check(force=True) == "success"
    assert [p.name for p in live.rec.policies] == ["least-load"]


def test_initial_invalid_raises_policy_error(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(BAD)
    rec = Recorder()
    with pytest.raises(PolicyError, match=r"scorers\[0\]\.weight"):
        PolicyWatcher(f, rec.apply, rec.result, INTERVAL).load_initial()


def test_initial_and_reload_refuse_a_file_in_the_same_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_bytes(b"name: \xff\n")
    rec = Recorder()
    w = PolicyWatcher(f, rec.apply, rec.result, INTERVAL)
    with pytest.raises(PolicyError) as initial:
        w.load_initial()
    assert str(initial.value).startswith(f"{f}: not UTF-8 text: ")
    with caplog.at_level(logging.ERROR, logger="router.gateway.config.reload"):
        assert w.check() == "error"
    assert f"the current policy stays: {initial.value}" in caplog.text


def configmap(root: Path, content: str, version: int) -> None:
    """Lay out a ConfigMap volume the way the kubelet does, swapping ``..data`` atomically."""
    target = root / f"..2024_01_01_00_00_0{version}"
    target.mkdir()
    (target / "policy.yaml").write_text(content)
    tmp = root / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, root / "..data")
    link = root / "policy.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/policy.yaml")


def test_reload_follows_configmap_data_symlink_swap(tmp_path: Path) -> None:
    configmap(tmp_path, GOOD, 1)
    rec = Recorder()
    w = PolicyWatcher(tmp_path / "policy.yaml", rec.apply, rec.result, INTERVAL)
    assert w.load_initial().name == "least-load"
    configmap(tmp_path, OTHER, 2)
    assert w.check() == "success"
    configmap(tmp_path, BAD, 3)
    assert w.check() == "error"
    assert [p.name for p in rec.policies] == ["round-robin"]


async def test_run_polls_each_interval_and_request_forces(running: Watched) -> None:
    r = running
    r.file.write_text(OTHER)
    await r.clock.advance(INTERVAL)
    assert await r.rec.settled(1) == ["success"]
    r.watcher.request()  # unchanged content, reloaded all the same
    assert await r.rec.settled(2) == ["success", "success"]
    assert [p.name for p in r.rec.policies] == ["round-robin", "round-robin"]


async def test_run_request_between_polls_keeps_their_cadence(running: Watched) -> None:
    r = running
    await r.clock.advance(INTERVAL / 2)
    r.file.write_text(OTHER)
    r.watcher.request()
    assert await r.rec.settled(1) == ["success"]
    r.file.write_text(GOOD)
    await r.clock.advance(INTERVAL / 2)  # the poll due at INTERVAL, not INTERVAL after the request
    assert await r.rec.settled(2) == ["success", "success"]
    assert [p.name for p in r.rec.policies] == ["round-robin", "least-load"]


async def test_run_without_polling_only_request_reloads(tmp_path: Path) -> None:
    live = watched(tmp_path, poll=False)
    task = asyncio.create_task(live.watcher.run())
    try:
        live.file.write_text(OTHER)
        await live.clock.advance(100 * INTERVAL)
        assert live.sleeps == [] and live.rec.results == []  # no timer: nothing can poll
        live.watcher.request()
        assert await live.rec.settled(1) == ["success"]
        assert live.sleeps == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# -- hostile files: refused quickly, off the event loop, the live policy kept ----------------


def test_reload_alias_bomb_rejected_old_policy_stays(
    live: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{k}: &{k} [{','.join(['*' + p] * 9)}]\n"
        for p, k in zip("abcdefgh", "bcdefghi", strict=True)
    )
    live.file.write_text(GOOD + bomb + "description: *i\n")
    with caplog.at_level(logging.ERROR):
        assert live.watcher.check() == "error"
    assert live.rec.policies == [] and live.rec.results == ["error"]
    assert f"{live.file}: line " in caplog.text and "aliases" in caplog.text


def test_reload_oversized_file_rejected(live: Watched) -> None:
    live.file.write_text(OTHER + "#" * MAX_YAML_BYTES)
    assert live.watcher.check() == "error"
    assert live.rec.policies == []


def test_reload_unexpected_error_keeps_policy_reported_once(
    live: Watched, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(text: str, where: str) -> Policy:
        raise RuntimeError("a bug in the loader")

    monkeypatch.setattr(live.watcher, "_load", broken)
    live.file.write_text(OTHER)
    with caplog.at_level(logging.ERROR):
        assert live.watcher.check() == "error"
        assert live.watcher.check() is None  # the same content: reported once
    assert live.rec.policies == [] and live.rec.results == ["error"]
    assert "RuntimeError: 'a bug in the loader'" in caplog.text


async def test_run_parses_in_a_worker_thread(
    running: Watched, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    real = load_policy_text

    def spy(text: str, where: str) -> Policy:
        threads.append(threading.get_ident())
        return real(text, where)

    monkeypatch.setattr(running.watcher, "_load", spy)
    running.file.write_text(OTHER)
    await running.clock.advance(INTERVAL)
    assert await running.rec.settled(1) == ["success"]
    assert [p.name for p in running.rec.policies] == ["round-robin"]
    assert threads and threading.get_ident() not in threads  # applied here, parsed there
