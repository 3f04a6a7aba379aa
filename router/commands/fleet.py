"""Real kvrouter processes on loopback: started, waited for, always stopped.

What ``kvrouter demo``, the integration tests and the benchmarks share. ``start`` runs a
kvrouter subcommand (or any command that takes ``--port``) on a free loopback port, its output
appended to a log file; ``wait_ready`` polls one of its HTTP paths until it answers 200;
``running`` stops every process it holds when its block ends, whatever happened inside (SIGTERM
to all at once, SIGKILL to those still up after the grace). ``wait_until``, ``http_json`` and
``metric`` ask a running fleet how it is doing, without an event loop.

The standard library and the package's own dependencies only: the installed wheel's tests use
it from outside the checkout, and the gateway's worker supervisor takes its free ports here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from router.hostport import LOOPBACK, free_port

# kvrouter as this interpreter runs it: from the checkout in development, else the installed one.
KVROUTER = (sys.executable, "-m", "router.cli")
# A gateway drains in-flight requests on SIGTERM; 10 s covers a test's or the demo's longest.
STOP_GRACE_SECONDS = 10.0
READY_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.05


@dataclass
class Proc:
    """A started process, where it listens on loopback and where its output goes."""

    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path
    name: str = ""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_GRACE_SECONDS) -> int:
        """Stop the process (``sig`` first, SIGKILL after ``timeout``); return its exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        return self.reap(timeout)

    def reap(self, timeout: float = STOP_GRACE_SECONDS) -> int:
        """Wait for the process to exit (SIGKILL after ``timeout``); return its exit code."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)
        return int(self.popen.returncode)


def start(
    args: Sequence[str],
    log: Path,
    *,
    name: str = "",
    port: int = 0,
    host: str | None = None,
    command: Sequence[str] = KVROUTER,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``COMMAND ARGS [--host HOST] --port PORT`` (a free port when 0), not waiting.

    Its output is appended to ``log``, a file (several processes may share one) or a folder
    (then a file of its own in it, named after the subcommand and port); its environment is
    ``env`` over ``base_env`` (default: this process's).
    """
    port = port or free_port()
    what = args[0] if args else Path(command[-1]).name
    log_path = log_file(log, what, port)
    full_env = {**(os.environ if base_env is None else base_env), **(env or {})}
    cmd = [*command, *args, *(["--host", host] if host else []), "--port", str(port)]
    with log_path.open("ab") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)
    return Proc(popen, port, log_path, name or f"{what}:{port}")


def log_file(log: Path, what: str, port: int) -> Path:
    """Where ``start`` writes the output of ``what`` on ``port``: ``log`` itself, or a file of
    its own when ``log`` is a folder."""
    return log / f"kvrouter-{what}-{port}.log" if log.is_dir() else log


def start_ready(
    args: Sequence[str],
    log: Path,
    *,
    ready_path: str = "/health",
    timeout: float = READY_TIMEOUT_SECONDS,
    ready_headers: Mapping[str, str] | None = None,
    name: str = "",
    port: int = 0,
    host: str | None = None,
    command: Sequence[str] = KVROUTER,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """``start``, then ``wait_ready`` on ``ready_path`` (with ``ready_headers``); a process
    that never gets ready is killed before the error propagates."""
    proc = start(
        args, log, name=name, port=port, host=host, command=command, env=env, base_env=base_env,
        cwd=cwd,
    )  # fmt: skip
    try:
        wait_ready(f"{proc.url}{ready_path}", proc=proc, timeout=timeout, headers=ready_headers)
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc


def wait_ready(
    url: str,
    *,
    proc: Proc | None = None,
    timeout: float = READY_TIMEOUT_SECONDS,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Poll ``GET url`` (with ``headers``) until it answers 200, for up to ``timeout`` seconds.

    Raises RuntimeError when ``proc`` exits first and TimeoutError at the timeout, each naming
    the process's log.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    where = f"; its log: {proc.log_path}" if proc is not None else ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            code = proc.popen.returncode
            raise RuntimeError(f"{proc.name} exited with code {code} before {url} answered{where}")
        try:
            req = urllib.request.Request(url, headers={**(headers or {})})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            e.close()  # an unclosed error response leaks its socket
            last = e
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"{url} not ready after {timeout} s ({last}){where}")


def stop_all(procs: Sequence[Proc], timeout: float = STOP_GRACE_SECONDS) -> None:
    """Signal every process still up, newest first, then wait for each (SIGKILL after
    ``timeout``): they drain side by side, not one after another."""
    for p in reversed(procs):
        if p.alive():
            p.popen.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        p.reap(timeout)


@contextlib.contextmanager
def running(procs: list[Proc] | None = None) -> Iterator[list[Proc]]:
    """A list of processes, every one stopped on exit, including those appended inside."""
    held = [] if procs is None else procs
    try:
        yield held
    finally:
        stop_all(held)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds (bounded by ``timeout``); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"timed out waiting for {what} ({timeout} s)")


def http_json(url: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
    """GET ``url`` (POST ``body`` as JSON when given) and parse the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={**(headers or {})})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def metrics_text(proc: Proc) -> str:
    """The process's Prometheus exposition."""
    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=10) as r:
        text: str = r.read().decode()
    return text


def metric_in(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def metric(proc: Proc, name: str, **labels: str) -> float:
    """``metric_in`` of the process's /metrics now."""
    return metric_in(metrics_text(proc), name, **labels)
