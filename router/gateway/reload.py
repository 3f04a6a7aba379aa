"""Hot reload of the policy file: poll its content, swap a valid policy in, keep the old one
when the new one is invalid.

The file is re-read by path on every poll and compared by content hash, not by modification
time or inode: a Kubernetes ConfigMap volume updates by swapping its ``..data`` symlink to a new
directory, so the path's target changes while the old file stays as it was. Reading through the
path each time follows the swap. SIGHUP (``request``) reloads at once, even unchanged content.

A rejected file is reported once per distinct content (a log line with the file, the field
and the reason), not on every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from router.core.policy import Policy, PolicyError, load_policy_text

log = logging.getLogger(__name__)

Result = Literal["success", "error"]


def parse_policy_bytes(raw: bytes, where: str) -> Policy:
    """A policy from a file's bytes; raises ``PolicyError`` naming ``where`` and the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(f"{where}: not UTF-8 text: {e}") from None
    return load_policy_text(text, where)


class PolicyWatcher:
    """Polls one policy file and hands each new valid policy to ``apply``."""

    def __init__(
        self,
        path: Path,
        apply: Callable[[Policy], None],
        on_result: Callable[[Result], None],
        interval_seconds: float,
        poll: bool = True,
    ) -> None:
        self.path = path
        self._apply = apply
        self._on_result = on_result
        self._interval = interval_seconds
        self._poll = poll
        self._live: bytes | None = None  # hash of the content in use
        self._rejected: bytes | str | None = None  # hash (or read error) reported last
        self._wake = asyncio.Event()
        self._forced = False

    def load_initial(self) -> Policy:
        """The policy to start with; raises ``PolicyError`` (a gateway must not start without)."""
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise PolicyError(f"{self.path}: cannot read: {e.strerror or e}") from None
        policy = parse_policy_bytes(raw, str(self.path))
        self._live = hashlib.sha256(raw).digest()
        return policy

    def check(self, force: bool = False) -> Result | None:
        """Reload when the content changed (or ``force``); None when nothing happened."""
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            return self._reject(f"cannot read: {e.strerror or e}", None, force)
        digest = hashlib.sha256(raw).digest()
        if digest == self._live and not force:
            self._rejected = None  # back to the live content: a bad file again is news
            return None
        if digest == self._rejected and not force:
            return None
        try:
            policy = parse_policy_bytes(raw, str(self.path))
        except PolicyError as e:
            return self._reject(str(e), digest, force)
        self._apply(policy)
        self._live, self._rejected = digest, None
        log.info("policy %s loaded from %s", policy.name, self.path)
        self._on_result("success")
        return "success"

    def _reject(self, problem: str, digest: bytes | None, force: bool) -> Result | None:
        key: bytes | str = digest if digest is not None else problem
        if key == self._rejected and not force:
            return None
        self._rejected = key
        if not problem.startswith(str(self.path)):
            problem = f"{self.path}: {problem}"
        log.error("policy reload rejected, the current policy stays: %s", problem)
        self._on_result("error")
        return "error"

    def request(self) -> None:
        """Reload now (SIGHUP), even when the content did not change."""
        self._forced = True
        self._wake.set()

    async def run(self) -> None:
        """Poll (when enabled) and serve reload requests, forever."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval if self._poll else None):
                    await self._wake.wait()
            self._wake.clear()
            force, self._forced = self._forced, False
            self.check(force)
