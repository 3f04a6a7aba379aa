"""Soak: mixed traffic for many minutes, and whether the router's resources stay flat.

Three timed engine-sims behind ``kvrouter serve`` (kv-aware, a watched policy file, an admin
token). For ``--minutes``, ``--clients`` closed-loop clients send a mix of streamed chat
(most), non-streamed chat, completions and streams the client abandons after the first chunk,
over multi-turn conversations that share system prompts. Meanwhile, on schedules:

- every ``--fault-every`` seconds one engine answers its next three requests with a 503
  (retried on others), never within 5 s of a restart (two of three engines failing at once
  is a brown-out, where the retry budget sheds by design);
- every ``--reload-every`` seconds the policy file is rewritten, alternating two presets;
- every ``--restart-every`` seconds one engine is killed and started again on its port.

Every ``--sample-every`` seconds it records the router's RSS, open file descriptors and
threads (from /proc), the in-flight and queue gauges it exports, and the client outcomes so
far. At the end the traffic stops and, after a short rest, the gauges must be back at zero.

It prints the samples as a markdown table, then one JSON summary: requests by outcome,
5xx answers and client-side failures of requests that never started (goal 0), RSS and file
descriptors at the first and last third of the run (goal: flat), and the gauges at rest.

    python -m bench.soak [--minutes 20] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import CHAT, markdown_table
from router.commands.fleet import Proc, metric, running, start_ready
from router.hostport import LOOPBACK
from router.presets import preset_path

ADMIN_TOKEN = "soak-admin-token"
SYSTEMS = [" ".join(f"tenant {t} rule {i} is to be followed" for i in range(40)) for t in range(6)]
GAUGES = ("kvrouter_backend_inflight_requests", "kvrouter_backend_inflight_tokens")


@dataclass
class Outcomes:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str) -> None:
        self.counts[kind] += 1


def _proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "Threads"):
                out[name] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def _body(rng: random.Random, conv: list[dict[str, str]], kind: str) -> tuple[str, dict[str, Any]]:
    if kind == "completion":
        prompt = SYSTEMS[rng.randrange(len(SYSTEMS))] + f" question {rng.random()}"
        return "/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 8}
    conv.append({"role": "user", "content": f"turn {len(conv)} asks about {rng.random():.6f}"})
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": list(conv),
        "max_tokens": 8,
        "stream": kind in ("stream", "abandon"),
    }
    return CHAT, body


async def _client(
    k: int, router: Proc, until: float, out: Outcomes, rng: random.Random, cap: int
) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(router.url, timeout=timeout) as http:
        conv: list[dict[str, str]] = []
        for _ in range(cap):  # bounded in count as well as by the clock
            if time.monotonic() >= until:
                return
            if not conv or len(conv) > 12:
                conv = [{"role": "system", "content": SYSTEMS[(k + rng.randrange(3)) % 6]}]
            kind = rng.choices(["stream", "chat", "completion", "abandon"], [6, 2, 1, 1])[0]
            path, body = _body(rng, conv, kind)
            started = False
            try:
                async with http.post(path, json=body) as r:
                    if kind == "abandon" and r.status == 200:
                        await r.content.readany()
                        out.add("abandoned")
                        continue  # leaving the block closes the connection mid-stream
                    data = await r.read()
                    started = True
                    if r.status != 200:
                        out.add(f"status_{r.status}")
                    elif kind == "stream" and b'"error"' in data:
                        out.add("stream_error_event")
                    else:
                        out.add("ok")
                    if kind in ("stream", "chat") and r.status == 200:
                        conv.append({"role": "assistant", "content": "an answer"})
            except (aiohttp.ClientError, TimeoutError):
                out.add("failed_started" if started else "failed_unstarted")


async def _chaos(
    engines: list[Proc], policy: Path, args: argparse.Namespace, until: float, log: list[str]
) -> None:
    presets = ["kv-aware", "least-load"]
    t0 = time.monotonic()
    # Half a period out of step, and never within 5 s of a restart: two engines failing at
    # once out of three is a brown-out, where the retry budget is meant to shed load.
    next_fault, next_reload, next_restart = (
        t0 + args.fault_every / 2,
        t0 + args.reload_every,
        t0 + args.restart_every,
    )
    reloads = faults = restarts = 0
    async with aiohttp.ClientSession() as http:
        while (now := time.monotonic()) < until:
            if now >= next_fault and abs(next_restart - now) < 5:
                next_fault += args.fault_every
            elif now >= next_fault:
                e = engines[faults % len(engines)]
                fault = {"mode": "status", "status": 503, "count": 3}
                async with http.post(f"{e.url}/fault", json=fault) as r:
                    await r.read()
                faults += 1
                next_fault += args.fault_every
            if now >= next_reload:
                reloads += 1
                shutil.copyfile(preset_path(presets[reloads % 2]), policy)
                next_reload += args.reload_every
            if now >= next_restart:
                i = restarts % len(engines)
                victim = engines[i]
                port = int(victim.url.rsplit(":", 1)[1])
                victim.popen.kill()
                victim.reap()
                await asyncio.sleep(1.0)
                engines[i] = await asyncio.to_thread(
                    start_ready, ["engine-sim", *SIM], victim.log_path.parent, port=port
                )
                restarts += 1
                log.append(f"t={now - t0:.0f}s restarted {victim.url}")
                next_restart += args.restart_every
            await asyncio.sleep(0.5)
    log.append(f"faults {faults}, reloads {reloads}, restarts {restarts}")


SIM = ["--decode-tokens-per-s", "400", "--prefill-tokens-per-s", "200000", "--max-batch", "16"]


async def _run(router: Proc, engines: list[Proc], policy: Path, args: argparse.Namespace) -> None:
    out = Outcomes()
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    rng = random.Random(7)
    events: list[str] = []
    clients = [
        asyncio.ensure_future(_client(k, router, until, out, random.Random(rng.random()), 10**7))
        for k in range(args.clients)
    ]
    chaos = asyncio.ensure_future(_chaos(engines, policy, args, until, events))
    samples: list[dict[str, float]] = []
    while time.monotonic() < until:
        await asyncio.sleep(min(args.sample_every, max(0.0, until - time.monotonic())))
        st = _proc_status(router.popen.pid)
        samples.append(
            {
                "t": round(time.monotonic() - t0),
                "rss_mb": round(st["VmRSS"] / 1024, 1),
                "fds": st["fds"],
                "threads": st["Threads"],
                "inflight": metric(router, GAUGES[0]),
                "queued": metric(router, "kvrouter_queue_depth"),
                "requests": sum(out.counts.values()),
            }
        )
    await asyncio.gather(*clients, chaos)
    await asyncio.sleep(3.0)  # at rest: every gauge must be back at zero
    rest = {name: metric(router, name) for name in GAUGES}
    rest["kvrouter_queue_depth"] = metric(router, "kvrouter_queue_depth")
    st = _proc_status(router.popen.pid)
    head = ["t (s)", "RSS (MB)", "fds", "threads", "in flight", "queued", "requests"]
    rows = [[str(s[k]) for k in ("t", "rss_mb", "fds", "threads", "inflight", "queued", "requests")]
            for s in samples]  # fmt: skip
    print(markdown_table(head, rows))
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]

    def mean(xs: list[dict[str, float]], key: str) -> float:
        return round(sum(x[key] for x in xs) / len(xs), 1)

    summary = {
        "minutes": args.minutes,
        "clients": args.clients,
        "outcomes": dict(out.counts),
        "status_5xx": sum(n for k, n in out.counts.items() if k.startswith("status_5")),
        "failed_unstarted": out.counts["failed_unstarted"],
        "rss_mb_first_third": mean(first, "rss_mb"),
        "rss_mb_last_third": mean(last, "rss_mb"),
        "fds_first_third": mean(first, "fds"),
        "fds_last_third": mean(last, "fds"),
        "threads_first_last": [samples[0]["threads"], samples[-1]["threads"]],
        "at_rest": rest,
        "fds_at_rest": st["fds"],
        "chaos": events,
    }
    print(json.dumps(summary, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    ap.add_argument("--fault-every", type=float, default=20.0, help="seconds")
    ap.add_argument("--reload-every", type=float, default=60.0, help="seconds")
    ap.add_argument("--restart-every", type=float, default=180.0, help="seconds")
    ap.add_argument("--logs", type=Path, help="keep the processes' logs in this folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, running([]) as procs:
        tmp = args.logs or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        engines = [start_ready(["engine-sim", *SIM], tmp) for _ in range(3)]
        procs.extend(engines)
        policy = tmp / "policy.yaml"
        shutil.copyfile(preset_path("kv-aware"), policy)
        config = tmp / "serve.yaml"
        config.write_text(
            f"policy: {policy}\n"
            "policy_reload: {enabled: true, interval_seconds: 1}\n"
            "health: {interval_seconds: 1, readmit_backoff_seconds: 1, "
            "readmit_backoff_max_seconds: 4}\n"
        )
        cmd = ["serve", "--config", str(config), "--host", LOOPBACK]
        for e in engines:
            cmd += ["--engine", e.url]
        env = {"KVROUTER_ADMIN_TOKEN": ADMIN_TOKEN}
        router = start_ready(cmd, tmp, ready_path="/ready", env=env)
        procs.append(router)
        try:
            asyncio.run(_run(router, engines, policy, args))
        finally:
            procs.extend(engines)  # the restarted ones, so that every one is stopped


if __name__ == "__main__":
    main()
