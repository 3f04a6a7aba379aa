"""The gateway's memory and event loop under large request bodies.

Starts ``kvrouter engine-sim --fast`` and, for each case, a fresh ``kvrouter serve`` in front of
it with ``limits.max_body_bytes`` set to the body size, then sends ``--bodies`` bodies at once,
each just under that limit:

- ``tokens``: completions whose prompt is token ids (7 bytes of JSON each, a Python int each
  once parsed: the largest growth from bytes to objects);
- ``messages``: chat requests of many one-word messages (a dict per message).

It reads the router's resident memory from /proc/PID/status (Linux only): VmRSS before the
bodies (after one small request), and the peak, VmHWM, after all of them were answered. Growth
is the peak minus the baseline. Meanwhile a thread asks GET /health every 20 ms; the longest
answer shows how long the event loop was blocked.

``--checkout DIR`` runs kvrouter from another copy of the source (for example an unpacked
``git archive`` of an older commit), to compare before and after a change on one machine.

    python -m bench.memory [--bodies 8] [--body-mib 16] [--cases tokens messages]
                           [--checkout DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from tests.support import CHECKOUT_KVROUTER, ROOT, Proc, running, start_kvrouter

MIB = 1024 * 1024


def token_body(limit: int) -> bytes:
    """A completions body of token ids, as close under ``limit`` bytes as whole ids allow."""
    n = limit // 6
    while True:
        ids = [1000 + (i * 7919) % 149_000 for i in range(n)]
        body = orjson.dumps({"model": "sim-model", "prompt": ids, "max_tokens": 1})
        if len(body) <= limit:
            return body
        n -= (len(body) - limit) // 7 + 1


def messages_body(limit: int) -> bytes:
    """A chat body of many one-word messages, under ``limit`` bytes."""
    one = len(orjson.dumps({"role": "user", "content": "w0000000"})) + 1
    n = (limit - 200) // one
    messages = [{"role": "user", "content": f"w{i:07d}"} for i in range(n)]
    return orjson.dumps({"model": "sim-model", "messages": messages, "max_tokens": 1})


BODIES = {
    "tokens": ("/v1/completions", token_body),
    "messages": ("/v1/chat/completions", messages_body),
}


def status_kib(pid: int, field: str) -> int:
    """A ``VmRSS``-like field of /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class HealthProbe(threading.Thread):
    """GET /health every ``interval`` seconds until stopped; keeps the longest answer time."""

    def __init__(self, url: str, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.longest = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=30) as r:
                    r.read()
            except OSError:
                pass
            self.longest = max(self.longest, time.perf_counter() - t0)
            self.stop.wait(self.interval)


async def send_all(url: str, path: str, body: bytes, n: int) -> Counter[int]:
    """``n`` copies of ``body`` at once; the statuses they were answered with."""
    timeout = aiohttp.ClientTimeout(total=600)
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def one() -> int:
            async with http.post(url + path, data=io.BytesIO(body), headers=headers) as r:
                await r.read()
                return r.status

        return Counter(await asyncio.gather(*(one() for _ in range(n))))


def run_case(
    case: str, engine: Proc, tmp: Path, procs: list[Proc], args: argparse.Namespace
) -> dict[str, object]:
    limit = args.body_mib * MIB
    path, make = BODIES[case]
    body = make(limit)
    config = tmp / f"serve-{case}.yaml"
    config.write_text(f"limits: {{max_body_bytes: {limit}}}\n")
    command, cwd, env = CHECKOUT_KVROUTER, ROOT, None
    if args.checkout:
        cwd = Path(args.checkout).resolve()
        env = {"PYTHONPATH": str(cwd)}
    router = start_kvrouter(
        ["serve", "--config", str(config), "--host", "127.0.0.1", "--backend", engine.url],
        tmp,
        ready_path="/ready",
        command=command,
        cwd=cwd,
        env=env,
    )
    procs.append(router)
    pid = router.popen.pid
    small = {"model": "sim-model", "prompt": "hello", "max_tokens": 1}
    asyncio.run(send_all(router.url, "/v1/completions", orjson.dumps(small), 1))
    baseline = status_kib(pid, "VmRSS")
    probe = HealthProbe(router.url)
    probe.start()
    try:
        statuses = asyncio.run(send_all(router.url, path, body, args.bodies))
    finally:
        probe.stop.set()
        probe.join()
    peak = status_kib(pid, "VmHWM")
    after = status_kib(pid, "VmRSS")
    router.stop()
    procs.remove(router)
    return {
        "case": case,
        "body_mib": len(body) / MIB,
        "baseline_mib": baseline / 1024,
        "peak_mib": peak / 1024,
        "growth_mib": (peak - baseline) / 1024,
        "after_mib": after / 1024,
        "longest_health_ms": probe.longest * 1000,
        "statuses": dict(statuses),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bodies", type=int, default=8, help="bodies sent at once")
    p.add_argument("--body-mib", type=int, default=16, help="limits.max_body_bytes, in MiB")
    p.add_argument("--cases", nargs="+", choices=sorted(BODIES), default=["tokens", "messages"])
    p.add_argument("--checkout", help="run kvrouter from this source tree instead")
    args = p.parse_args(argv)
    if not Path("/proc/self/status").exists():
        print("bench.memory needs Linux /proc", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        tmp_path = Path(tmp)
        engine = start_kvrouter(["engine-sim", "--fast"], tmp_path)
        procs.append(engine)
        for case in args.cases:
            rows.append(run_case(case, engine, tmp_path, procs, args))
    source = args.checkout or os.path.relpath(ROOT)
    print(f"kvrouter from {source}; {args.bodies} bodies at once,", end=" ")
    print(f"max_body_bytes {args.body_mib} MiB")
    print(
        "| case | body MiB | baseline MiB | peak MiB | growth MiB | after MiB"
        " | longest /health ms | statuses |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['body_mib']:.1f} | {r['baseline_mib']:.0f} | {r['peak_mib']:.0f}"
            f" | {r['growth_mib']:.0f} | {r['after_mib']:.0f} | {r['longest_health_ms']:.0f}"
            f" | {r['statuses']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
