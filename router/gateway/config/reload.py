"""Hot reload of the files the gateway serves from: poll a file's content, swap a valid new
version in, keep the old one when the new one is invalid.

Two files are watched, each by a ``FileWatcher``: the policy (``PolicyWatcher``), and the
config file, of which only the ``models`` section is applied live (``ModelsWatcher``; the other
sections are read at start, and an edit to them takes a restart, though any error in the file
still refuses it whole). Both go by the ``policy_reload`` settings.

A file is re-read by path on every poll and compared by content hash, not by modification
time or inode: a Kubernetes ConfigMap volume updates by swapping its ``..data`` symlink to a new
directory, so the path's target changes while the old file stays as it was. Reading through the
path each time follows the swap. SIGHUP (``request``) reloads at once, even unchanged content.

A rejected file is reported once per distinct content (a log line with the file, the field
and the reason), not on every poll. The watcher reads and parses in a worker thread
(``asyncio.to_thread``), so a large or hostile file never stalls the requests being served.
Its size is bounded by the gateway's one reader of its files (``router.yaml_files``,
which the config file goes through too, so both are refused in the same words), its aliases
and nesting by the loader (``router.core.fields``), and any failure, expected or not, leaves the
live version in place.

Polls keep their cadence on the watcher's clock: one every ``interval_seconds``, however many
requested reloads come in between. The clock (``now``) and the wait (``sleep``) are passed in,
so tests move time by hand.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, Literal, TypeVar

from router.core.fields import ConfigError, show
from router.core.policy import Policy, PolicyError, load_policy_text
from router.gateway.config.models import ModelAliases
from router.gateway.config.settings import load_config_text
from router.yaml_files import read_bytes, text_of

log = logging.getLogger(__name__)

Result = Literal["success", "error"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Read(Generic[T]):
    """What one look at the file found: nothing new, a new version, or a problem."""

    digest: bytes | None = None  # of the content read (None: unreadable)
    loaded: T | None = None
    problem: str | None = None
    unchanged: bool = False


class FileWatcher(Generic[T]):
    """Polls one file and hands each new valid version (``_load(text, where)``) to ``apply``;
    a subclass says how to load it: ``_load`` raises ``error`` for a file it refuses, and
    ``what`` names the file in logs."""

    error: ClassVar[type[ValueError]]
    what: ClassVar[str]

    def __init__(
        self,
        path: Path,
        apply: Callable[[T], None],
        on_result: Callable[[Result], None],
        interval_seconds: float,
        poll: bool = True,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.path = path
        self._error = self.error
        self._apply = apply
        self._on_result = on_result
        self._interval = interval_seconds
        self._poll = poll
        self._now = now
        self._sleep = sleep
        self._live: bytes | None = None  # hash of the content in use
        self._rejected: bytes | str | None = None  # hash (or read error) reported last
        self._wake = asyncio.Event()
        self._forced = False

    def _load(self, text: str, where: str) -> T:
        """The file's ``text`` loaded; raises ``error`` for one it refuses."""
        raise NotImplementedError

    def load_initial(self) -> T:
        """The version to start with; raises ``error`` (a gateway must not start without)."""
        raw = read_bytes(self.path, self._error)
        loaded = self._load(text_of(raw, str(self.path), self._error), str(self.path))
        self._live = hashlib.sha256(raw).digest()
        return loaded

    def check(self, force: bool = False) -> Result | None:
        """Reload when the content changed (or ``force``); None when nothing happened."""
        return self._settle(self._read(force), force)

    async def check_off_loop(self, force: bool = False) -> Result | None:
        """``check``, reading and parsing in a worker thread; applying on the event loop."""
        return self._settle(await asyncio.to_thread(self._read, force), force)

    def _read(self, force: bool) -> _Read[T]:
        """Read and parse the file if it changed; touches nothing (runs in a thread)."""
        try:
            raw = read_bytes(self.path, self._error)
        except self._error as e:
            return _Read(problem=str(e))
        digest = hashlib.sha256(raw).digest()
        if digest in (self._live, self._rejected) and not force:
            return _Read(digest, unchanged=True)
        where = str(self.path)
        try:
            return _Read(digest, loaded=self._load(text_of(raw, where, self._error), where))
        except self._error as e:
            return _Read(digest, problem=str(e))
        except Exception as e:  # a bug, or a limit not thought of: the live version stays
            return _Read(digest, problem=f"unexpected {type(e).__name__}: {show(str(e))}")

    def _settle(self, read: _Read[T], force: bool) -> Result | None:
        if read.unchanged:
            if read.digest == self._live:
                self._rejected = None  # back to the live content: a bad file again is news
            return None
        if read.loaded is None:
            return self._reject(read.problem or "unreadable", read.digest, force)
        self._apply(read.loaded)
        self._live, self._rejected = read.digest, None
        log.info("%s loaded from %s", self.what, self.path)
        self._on_result("success")
        return "success"

    def _reject(self, problem: str, digest: bytes | None, force: bool) -> Result | None:
        key: bytes | str = digest if digest is not None else problem
        if key == self._rejected and not force:
            return None
        self._rejected = key
        if not problem.startswith(str(self.path)):
            problem = f"{self.path}: {problem}"
        log.error("%s reload rejected, the current %s stays: %s", self.what, self.what, problem)
        self._on_result("error")
        return "error"

    def request(self) -> None:
        """Reload now (SIGHUP), even when the content did not change."""
        self._forced = True
        self._wake.set()

    async def run(self) -> None:
        """Poll (when enabled) and serve reload requests, forever."""
        due = self._now() + self._interval
        while True:
            await self._pause(max(0.0, due - self._now()) if self._poll else None)
            force, self._forced = self._forced, False
            if self._now() >= due:
                due = self._now() + self._interval
            await self.check_off_loop(force)

    async def _pause(self, seconds: float | None) -> None:
        """Until ``seconds`` have passed (None: no time limit) or a reload is requested."""
        if seconds is None:
            await self._wake.wait()
        else:
            wake = asyncio.ensure_future(self._wake.wait())
            timer = asyncio.ensure_future(self._sleep(seconds))
            try:
                await asyncio.wait((wake, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
                timer.cancel()
        self._wake.clear()


class PolicyWatcher(FileWatcher[Policy]):
    """The policy file's watcher: each new valid policy goes to ``apply``."""

    error = PolicyError
    what = "policy"

    def _load(self, text: str, where: str) -> Policy:
        return load_policy_text(text, where)


def models_of(text: str, where: str) -> ModelAliases:
    """The ``models`` section of a config file's text; raises ``ConfigError`` for any error in
    the file."""
    return load_config_text(text, where).models


class ModelsWatcher(FileWatcher[ModelAliases]):
    """The config file's watcher for its ``models`` section: new aliases go to ``apply``."""

    error = ConfigError
    what = "models section"

    def _load(self, text: str, where: str) -> ModelAliases:
        return models_of(text, where)
