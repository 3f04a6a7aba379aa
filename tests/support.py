"""What every test shares: real kvrouter processes, waits, metrics.

Integration tests start ``kvrouter`` subcommands as real processes on 127.0.0.1 with
``start_kvrouter``, built on the package's fleet module (router.commands.fleet, whose
``Proc``, ``running``, ``http_json`` and ``metric`` are re-exported here, with
router.hostport's ``free_port``); the returned handle stops the process (SIGTERM, then
SIGKILL) when the test ends, whatever happened in it.
``wait_until`` polls a condition, failing the test when it never holds; ``eventually`` is the
one way an async test waits for something to become true.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import aiohttp

from router.commands import fleet
from router.commands.fleet import KVROUTER, start_ready, wait_ready

# The fleet's own and the address module's, for every test to take from here.
from router.commands.fleet import Proc as Proc
from router.commands.fleet import http_json as http_json
from router.commands.fleet import metric as metric
from router.commands.fleet import metric_in as metric_in
from router.commands.fleet import metrics_text as metrics_text
from router.commands.fleet import running as running
from router.hostport import LOOPBACK as LOOPBACK
from router.hostport import free_port as free_port
from router.hostport import free_ports as free_ports

ROOT = Path(__file__).resolve().parent.parent
# kvrouter from this checkout, run by the interpreter running the tests.
CHECKOUT_KVROUTER = KVROUTER
T = TypeVar("T")


def wait_http(
    url: str,
    timeout: float = 30.0,
    proc: Proc | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Poll ``url`` (with ``headers``) until it answers 200 (bounded by ``timeout``); a failure
    carries ``proc``'s log, so the test report shows why."""
    with _log_in_failure(proc.log_path if proc is not None else None):
        wait_ready(url, proc=proc, timeout=timeout, headers=headers)


def start_kvrouter(
    args: Sequence[str],
    tmp_path: Path,
    *,
    port: int | None = None,
    ready_path: str = "/health",
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    command: Sequence[str] = CHECKOUT_KVROUTER,
    cwd: Path = ROOT,
    base_env: Mapping[str, str] | None = None,
    ready_headers: Mapping[str, str] | None = None,
) -> Proc:
    """Start ``kvrouter ARGS --port PORT`` and wait until ``ready_path`` answers 200.

    ``command`` runs kvrouter (default: the checkout's), in ``cwd``, with ``env`` over
    ``base_env`` (default: this process's environment); its log is a file in ``tmp_path``.
    """
    port = port or free_port()
    with _log_in_failure(fleet.log_file(tmp_path, args[0], port)):
        return start_ready(
            args,
            tmp_path,
            ready_path=ready_path,
            timeout=timeout,
            ready_headers=ready_headers,
            port=port,
            command=command,
            env=env,
            base_env=base_env,
            cwd=cwd,
        )


@contextlib.contextmanager
def _log_in_failure(log: Path | None) -> Iterator[None]:
    """A process that never got ready fails the test with its log in the message."""
    try:
        yield
    except (RuntimeError, TimeoutError) as e:
        if log is None or not log.exists():
            raise
        raise type(e)(f"{e}\n{log.read_text(errors='replace')}") from None


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds (bounded by ``timeout``); an AssertionError naming
    ``what`` otherwise, so a wait that never ends reads as the test's failure."""
    try:
        fleet.wait_until(check, what, timeout)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None


def status_of(url: str) -> int:
    """The HTTP status ``GET url`` answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)


def readiness(proc: Proc) -> dict[str, Any]:
    """The gateway's /ready body, whether it answers 200 or 503 (not every backend up yet)."""
    try:
        result: dict[str, Any] = http_json(f"{proc.url}/ready")
    except urllib.error.HTTPError as e:
        with e:
            result = json.loads(e.read())
    return result


async def ametric(proc: Proc, name: str, **labels: str) -> float:
    """``metric`` without blocking the event loop (load runs on it meanwhile)."""
    async with aiohttp.ClientSession() as http, http.get(f"{proc.url}/metrics") as r:
        return metric_in(await r.text(), name, **labels)


# The overloads are for mypy, which cannot split ``Awaitable[T] | T`` when the probe is a
# coroutine function (it infers T as Never); they are plain defs returning the coroutine.
@overload
def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ...
) -> Coroutine[Any, Any, T]: ...


@overload
def eventually(
    probe: Callable[[], T], *, timeout: float = ..., interval: float = ...
) -> Coroutine[Any, Any, T]: ...


async def eventually(
    probe: Callable[[], Awaitable[T] | T],
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 - a polling budget, not a deadline to cancel at
    interval: float = 0.05,
) -> T:
    """Call ``probe`` until it returns a truthy value (returned) or stops raising
    AssertionError; at ``timeout`` seconds re-raise its last AssertionError, or raise one."""
    deadline = time.monotonic() + timeout
    last: AssertionError | None = None
    answer: object = None
    # Bounded by count as well as by time, so the number of calls is known whatever the clock.
    for _ in range(int(timeout / interval) + 1):
        try:
            result = probe()
            if inspect.isawaitable(result):
                result = await result
        except AssertionError as e:
            last = e
        else:
            # None is an assertion-style probe that passed; False, 0 or empty is "not yet".
            if result or result is None:
                return result
            last, answer = None, result
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    if last is not None:
        raise last
    what = getattr(probe, "__qualname__", repr(probe))
    raise AssertionError(f"{what} did not hold within {timeout:g}s (last answer {answer!r})")
