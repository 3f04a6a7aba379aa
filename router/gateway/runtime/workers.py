"""``kvrouter serve --workers N``: N gateway processes on one port, routing as one fleet.

One Python process spends about a millisecond of CPU per proxied request, on one core at most;
several processes can use several cores. Each worker is a whole gateway
(``router.gateway.runtime.serve.run_gateway``) started with the ``spawn`` method: it listens on
the same host:port with SO_REUSEPORT (the kernel spreads new connections over the workers) and
is a gossip replica (``router.gateway.replicas.replica``), so that what one worker routes, and
its in-flight load, reaches the others. Their gossip configs
(``router.gateway.replicas.node_config.worker_configs``):

- without gossip configured, the workers form a private fleet on loopback: each listens on a
  free 127.0.0.1 port, seeds with its siblings, runs the ``local`` preset and authenticates
  with the configured secret variable's value, else a random secret made for this run (handed
  to the workers with their settings, never written to the environment);
- with gossip configured (``--gossip-port P``), worker i gossips on P + i with the configured
  secret or TLS, seeds with the configured peers and its siblings, and so joins the external
  fleet as one more replica.

A configured node id (or $POD_NAME) gets ``-w<i>`` appended, one per worker.

The parent only supervises: it forwards SIGHUP, and the first SIGTERM or SIGINT, to every
worker; when one worker exits it stops the others and exits too (with the first failing
worker's code). It restarts nothing: a worker that dies takes the group down, for the pod's
supervisor to restart. A worker whose parent disappears stops itself. ``/metrics`` is per
worker: a scrape reaches whichever worker the kernel picks, and the series carry no worker
label (a known limitation: per-pod totals need every worker scraped).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from types import FrameType

from router.core.fields import ConfigError
from router.gateway.config.settings import Config
from router.gateway.replicas.node_config import worker_configs
from router.gateway.runtime.serve import run_gateway, setup_logging
from router.gossip.config import GossipConfig

log = logging.getLogger(__name__)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# After the first worker exits, the others get their drain's grace and this margin (the cut,
# the cleanup) before they are killed.
STOP_MARGIN_SECONDS = 5.0
# How often the supervisor looks at its workers even when no sentinel woke it.
POLL_SECONDS = 0.5


def _stop_with_parent() -> None:
    """In a worker: SIGTERM ourselves once the parent process has gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker(index: int, cfg: Config, gossip: GossipConfig, level: str) -> None:
    """A worker process: one gateway on the shared port, a replica of the workers' fleet."""
    # Until the gateway's loop takes it over, a forwarded SIGHUP must not kill the worker.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    setup_logging(level, f"[worker {index}]")
    _stop_with_parent()
    sys.exit(run_gateway(cfg, gossip, reuse_port=True))


def _code(p: BaseProcess) -> int:
    code = p.exitcode
    if code is None or code < 0:  # still running, or killed by a signal
        return 1
    return code


def supervise(cfg: Config, n: int, level: str) -> int:
    """Run ``n`` workers until they exit; the exit code. Raises ``ConfigError``."""
    if n < 1:
        raise ConfigError(f"--workers: must be at least 1, got {n}")
    if cfg.listen.port == 0:
        raise ConfigError("--workers: several workers need a fixed --port (not 0) to share")
    gossips = worker_configs(cfg, n, os.environ)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(i, cfg, gossips[i], level), name=f"kvrouter-worker-{i}")
        for i in range(n)
    ]
    stopping = False

    def forward(sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if sig != signal.SIGHUP:
            # Once only: a worker that has finished draining has given its handlers back, and
            # a second signal would kill it mid-exit.
            if stopping:
                return
            stopping = True
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        for p in procs:
            p.start()
        log.info(
            "%d workers on %s:%d (pids %s)",
            n,
            cfg.listen.host,
            cfg.listen.port,
            " ".join(str(p.pid) for p in procs),
        )
        first: BaseProcess | None = None
        deadline: float | None = None
        while True:
            # Look at every worker, not only those alive at the last look: a sentinel fires
            # while the process is still exiting, before waitpid can see it gone, so a death
            # is often first visible one turn later.
            if first is None:
                first = next((p for p in procs if p.exitcode is not None), None)
                if first is not None:
                    if not stopping:
                        log.warning(
                            "worker %s exited (code %s): stopping the others",
                            first.name,
                            first.exitcode,
                        )
                    forward(signal.SIGTERM, None)
                    deadline = time.monotonic() + cfg.drain.grace_seconds + STOP_MARGIN_SECONDS
            alive = [p for p in procs if p.exitcode is None]
            if not alive:
                break
            if deadline is not None and time.monotonic() >= deadline:
                for p in alive:
                    log.warning("worker %s did not stop in time: killing it", p.name)
                    p.kill()
                deadline = None
            # The sentinels wake us when a worker exits; the poll interval is a backstop.
            timeout = (
                POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - time.monotonic())
            )
            multiprocessing.connection.wait([p.sentinel for p in alive], max(0.0, timeout))
        for p in procs:
            p.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = [p for p in procs if _code(p) != 0]
    return _code(failed[0]) if failed else 0
