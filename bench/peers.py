"""The routers bench.sglang_compare measures, and the processes it starts for them.

kvrouter (``kvrouter serve`` with a preset, or the same from another source tree: the
baseline), SGLang's router (sglang-router, ``sglang_router.launch_router``) and SMG, SGLang's
model gateway (smg, ``smg.launch_router``; its per-worker overload protection is switched off,
since engine-sim reports no load it reads), each in front of engine-sims, every process on a
free loopback port (router.commands.fleet). ``start_routers`` starts one router, or a kvrouter
as several replicas gossiping on loopback; each returns once its engines are healthy.
"""

from __future__ import annotations

import signal
import sys
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import GOSSIP_SECRET, alive_peers
from router.commands.fleet import Proc, http_json, start, start_ready, wait_until
from router.hostport import LOOPBACK, free_port, free_ports

MODEL = "sim-model"
STARTUP_TIMEOUT_SECONDS = 60.0

KVROUTER_POLICIES = {"kvrouter kv-aware": "kv-aware", "kvrouter round-robin": "round-robin"}
SGLANG_POLICIES = {"sglang cache_aware": "cache_aware", "sglang round_robin": "round_robin"}
SMG_POLICIES = {"smg cache_aware": "cache_aware", "smg round_robin": "round_robin"}
ROUTERS = (*KVROUTER_POLICIES, *SGLANG_POLICIES, *SMG_POLICIES)
# kvrouter kv-aware from another source tree (--baseline): before and after, in one run.
BASELINE = "kvrouter baseline"


@dataclass(frozen=True)
class Peer:
    """How to launch one of SGLang's routers: its module (the `bench` extra) and flags."""

    label: str
    module: str
    flags: tuple[str, ...] = ()


SGLANG = Peer("SGLang's router", "sglang_router.launch_router")
# engine-sim reports none of the load SMG reads: its overload protection would only guess.
SMG = Peer("SMG", "smg.launch_router", ("--disable-worker-overload-protection",))


def start_peer(
    peer: Peer,
    workers: Sequence[str],
    policy: str,
    tmp: Path,
    worker_flags: Sequence[str] | None = None,
) -> Proc:
    """``peer`` with ``policy`` in front of ``workers``; returns once all are healthy.

    ``worker_flags`` replace ``--worker-urls WORKERS`` (SMG's ``--pd-disaggregation`` pools).
    Its Prometheus exporter is kept on loopback too, its per-request INFO logging is off (as
    kvrouter's is at ``--log-level warning``), and a short shutdown grace keeps stopping quick.
    """
    port = free_port()
    log = tmp / f"{peer.module.split('.')[0]}-{policy}-{port}.log"
    flags = [
        *(["--worker-urls", *workers] if worker_flags is None else worker_flags),
        "--policy", policy,
        "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()),
        "--log-level", "warn",
        "--shutdown-grace-period-secs", "1",
        *peer.flags,
    ]  # fmt: skip
    command = (sys.executable, "-m", peer.module)
    proc = start(flags, log, name=peer.label, port=port, host=LOOPBACK, command=command, cwd=tmp)
    try:
        _wait_peer_workers(peer, proc, len(workers))
    except BaseException:
        proc.stop(signal.SIGKILL)
        raise
    return proc


def _wait_peer_workers(peer: Peer, proc: Proc, n: int) -> None:
    # It answers /health before its workers are registered; GET /workers says when they are.
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    last: object = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{peer.label} exited early:\n{proc.log()}")
        try:
            workers = http_json(f"{proc.url}/workers").get("workers", [])
            last = workers
            if sum(1 for w in workers if w.get("is_healthy")) >= n:
                return
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{peer.label}: {n} healthy workers not listed ({last})\n{proc.log()}")


def start_router(
    name: str,
    engines: Sequence[Proc],
    tmp: Path,
    policy_file: Path | None,
    checkout: Path | None = None,
    config: Path | None = None,
    extra: Sequence[str] = (),
) -> Proc:
    """Router ``name`` (one of ``ROUTERS``, or ``BASELINE`` from ``checkout``) before
    ``engines``; ``extra``: more ``kvrouter serve`` flags."""
    urls = [e.url for e in engines]
    if name in SGLANG_POLICIES:
        return start_peer(SGLANG, urls, SGLANG_POLICIES[name], tmp)
    if name in SMG_POLICIES:
        return start_peer(SMG, urls, SMG_POLICIES[name], tmp)
    preset = "kv-aware" if name == BASELINE else KVROUTER_POLICIES[name]
    policy = str(policy_file) if policy_file is not None else preset
    backends = [a for u in urls for a in ("--backend", u)]
    args = ["serve", "--host", LOOPBACK, *backends, "--policy", policy, "--log-level", "warning"]
    if config is not None:
        args += ["--config", str(config)]
    args += extra
    env = {"KVROUTER_GOSSIP_SECRET": GOSSIP_SECRET}  # for --replicas; never leaves loopback
    if name != BASELINE:
        return start_ready(args, tmp, ready_path="/ready", timeout=STARTUP_TIMEOUT_SECONDS, env=env)
    assert checkout is not None, "the baseline runs from a checkout"
    return start_ready(
        args,
        tmp,
        ready_path="/ready",
        timeout=STARTUP_TIMEOUT_SECONDS,
        cwd=checkout,
        env={**env, "PYTHONPATH": str(checkout)},
    )


def start_routers(
    name: str,
    engines: Sequence[Proc],
    tmp: Path,
    policy_file: Path | None,
    replicas: int,
    checkout: Path | None = None,
    config: Path | None = None,
) -> list[Proc]:
    """Router ``name``; a kvrouter as ``replicas`` replicas gossiping on loopback, each
    joining through the first (the first through the second), once all see each other."""
    if replicas == 1 or name in SGLANG_POLICIES or name in SMG_POLICIES:
        return [start_router(name, engines, tmp, policy_file, checkout, config)]
    ports = free_ports(replicas)
    procs: list[Proc] = []
    try:
        for i, port in enumerate(ports):
            seed = ports[1] if i == 0 else ports[0]
            flags = ["--gossip-port", str(port), "--gossip-peer", f"{LOOPBACK}:{seed}"]
            flags += ["--gossip-preset", "local"]
            procs.append(start_router(name, engines, tmp, policy_file, checkout, config, flags))
        wait_until(
            lambda: all(alive_peers(p) == replicas - 1 for p in procs),
            f"{name}: {replicas} replicas all seeing each other",
            STARTUP_TIMEOUT_SECONDS,
        )
    except BaseException:
        for p in procs:
            p.stop(signal.SIGKILL)
        raise
    return procs


def start_engines(n: int, flags: Sequence[str], tmp: Path, procs: list[Proc]) -> list[Proc]:
    """``n`` engine-sims with ``flags``, each added to ``procs`` as it starts."""
    engines = []
    for _ in range(n):
        engines.append(start_ready(["engine-sim", *flags], tmp, host=LOOPBACK))
        procs.append(engines[-1])
    return engines
