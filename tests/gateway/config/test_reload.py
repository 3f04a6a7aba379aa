"""Policy hot reload: content-hash polling, ConfigMap symlink swaps, bad files, SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from router.core.fields import MAX_YAML_BYTES
from router.core.policy import Policy, PolicyError
from router.gateway.config import reload
from router.gateway.config.reload import PolicyWatcher, Result
from router.presets import preset_path

GOOD = preset_path("least-load").read_text()
OTHER = preset_path("round-robin").read_text()
BAD = "name: broken\nscorers:\n  - type: load\n    weight: lots\n"


class Recorder:
    def __init__(self) -> None:
        self.policies: list[Policy] = []
        self.results: list[Result] = []

    def apply(self, p: Policy) -> None:
        self.policies.append(p)

    def result(self, r: Result) -> None:
        self.results.append(r)


def watcher(path: Path, rec: Recorder, interval: float = 60.0, poll: bool = True) -> PolicyWatcher:
    return PolicyWatcher(path, rec.apply, rec.result, interval, poll)


def test_reload_unchanged_content_nothing(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    assert w.load_initial().name == "least-load"
    f.write_text(GOOD)  # rewritten, same bytes
    assert w.check() is None
    assert rec.results == []


def test_reload_changed_content_applies_new_policy(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    f.write_text(OTHER)
    assert w.check() == "success"
    assert [p.name for p in rec.policies] == ["round-robin"]


def test_reload_invalid_logged_once_old_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    f.write_text(BAD)
    with caplog.at_level(logging.ERROR, logger="router.gateway.config.reload"):
        assert w.check() == "error"
        assert w.check() is None  # same bad content: not counted again
    assert rec.policies == [] and rec.results == ["error"]
    assert f"{f}: scorers[0].weight: must be a number" in caplog.text
    assert "the current policy stays" in caplog.text
    f.write_text(OTHER)
    assert w.check() == "success"


def test_reload_back_to_live_content_after_bad_one_is_quiet(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    f.write_text(BAD)
    w.check()
    f.write_text(GOOD)  # the live policy again: nothing to swap
    assert w.check() is None
    f.write_text(BAD)  # the same bad content once more: counted again, it is news
    assert w.check() == "error"


def test_reload_missing_file_error_once(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    f.unlink()
    assert w.check() == "error"
    assert w.check() is None
    assert rec.results == ["error"]


def test_reload_force_reapplies_unchanged(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    assert w.check(force=True) == "success"
    assert [p.name for p in rec.policies] == ["least-load"]


def test_initial_invalid_raises_policy_error(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(BAD)
    with pytest.raises(PolicyError, match=r"scorers\[0\]\.weight"):
        watcher(f, Recorder()).load_initial()


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
    w = watcher(tmp_path / "policy.yaml", rec)
    assert w.load_initial().name == "least-load"
    configmap(tmp_path, OTHER, 2)
    assert w.check() == "success"
    configmap(tmp_path, BAD, 3)
    assert w.check() == "error"
    assert [p.name for p in rec.policies] == ["round-robin"]


async def test_run_polls_and_request_forces(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec, interval=0.02)
    w.load_initial()
    task = asyncio.create_task(w.run())
    try:
        f.write_text(OTHER)
        for _ in range(200):
            if rec.results:
                break
            await asyncio.sleep(0.01)
        assert rec.results == ["success"]
        w.request()
        for _ in range(200):
            if len(rec.results) == 2:
                break
            await asyncio.sleep(0.01)
        assert rec.results == ["success", "success"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_run_without_polling_only_request_reloads(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec, interval=0.01, poll=False)
    w.load_initial()
    task = asyncio.create_task(w.run())
    try:
        f.write_text(OTHER)
        await asyncio.sleep(0.1)
        assert rec.results == []
        w.request()
        for _ in range(200):
            if rec.results:
                break
            await asyncio.sleep(0.01)
        assert rec.results == ["success"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# -- hostile files: refused quickly, off the event loop, the live policy kept ----------------


def test_reload_alias_bomb_rejected_old_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{k}: &{k} [{','.join(['*' + p] * 9)}]\n"
        for p, k in zip("abcdefgh", "bcdefghi", strict=True)
    )
    f.write_text(GOOD + bomb + "description: *i\n")
    with caplog.at_level(logging.ERROR):
        assert w.check() == "error"
    assert rec.policies == [] and rec.results == ["error"]
    assert f"{f}: line " in caplog.text and "aliases" in caplog.text


def test_reload_oversized_file_rejected(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()
    f.write_text(OTHER + "#" * MAX_YAML_BYTES)
    assert w.check() == "error"
    assert rec.policies == []


def test_reload_unexpected_error_keeps_policy_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec)
    w.load_initial()

    def broken(raw: bytes, where: str) -> Policy:
        raise RuntimeError("a bug in the loader")

    monkeypatch.setattr(reload, "parse_policy_bytes", broken)
    f.write_text(OTHER)
    with caplog.at_level(logging.ERROR):
        assert w.check() == "error"
        assert w.check() is None  # the same content: reported once
    assert rec.policies == [] and rec.results == ["error"]
    assert "RuntimeError: 'a bug in the loader'" in caplog.text


async def test_run_parses_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(GOOD)
    rec = Recorder()
    w = watcher(f, rec, interval=0.02)
    w.load_initial()
    threads: list[int] = []
    real = reload.parse_policy_bytes

    def spy(raw: bytes, where: str) -> Policy:
        threads.append(threading.get_ident())
        return real(raw, where)

    monkeypatch.setattr(reload, "parse_policy_bytes", spy)
    task = asyncio.create_task(w.run())
    try:
        f.write_text(OTHER)
        for _ in range(500):
            if rec.results:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rec.results == ["success"] and [p.name for p in rec.policies] == ["round-robin"]
    assert threads and threading.get_ident() not in threads  # applied here, parsed there
