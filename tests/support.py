"""Helpers shared by every test: free loopback ports and real processes that always stop.

Integration tests start ``kvrouter`` subcommands as real processes on 127.0.0.1 with
``start_kvrouter``; the returned handle stops the process (SIGTERM, then SIGKILL) when the
test ends, whatever happened in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A running kvrouter subprocess and where it listens."""

    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Stop the process (``sig`` first, SIGKILL after ``timeout``); return its exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return int(self.popen.returncode)


def wait_http(url: str, timeout: float = 30.0, proc: Proc | None = None) -> None:
    """Poll ``url`` until it answers 200 (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited early:\n{proc.log()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            e.close()  # an unclosed error response leaks its socket
            last = e
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.05)
    detail = proc.log() if proc is not None else ""
    raise TimeoutError(f"{url} not ready after {timeout}s ({last})\n{detail}")


def start_kvrouter(
    args: Sequence[str],
    tmp_path: Path,
    *,
    port: int | None = None,
    ready_path: str = "/health",
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Proc:
    """Start ``kvrouter ARGS --port PORT`` and wait until ``ready_path`` answers 200."""
    port = port or free_port()
    log_path = tmp_path / f"kvrouter-{args[0]}-{port}.log"
    full_env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "router.cli", *args, "--port", str(port)]
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    proc = Proc(popen, port, log_path)
    try:
        wait_http(f"{proc.url}{ready_path}", timeout, proc)
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process in ``procs`` on exit, including ones appended inside the block."""
    try:
        yield procs
    finally:
        for p in reversed(procs):
            p.stop()
