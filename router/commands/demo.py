"""``kvrouter demo``: a live side-by-side of round-robin and kv-aware on real processes.

Starts four engine-sims and the gateway on free loopback ports, drives a multi-tenant,
multi-turn chat workload through the gateway with round-robin, hot-reloads the policy file to
kv-aware (no restart), clears the engines' caches, drives the same workload again, and prints
hit ratio, TTFT and throughput for both. Everything it starts is stopped at the end.

``--kv-events`` runs instead the comparison of approximate and precise kv-aware routing in
``router.commands.demo_kv_events``, on the fleet helpers of this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson

from router.core.stats import percentile
from router.core.workload import SyntheticSpec, TraceRequest, synthetic
from router.gateway.openai.sse import Decoder
from router.presets import preset_text

LOOPBACK = "127.0.0.1"
ENGINES = 4
# Engines fast enough for a demo under two minutes, slow enough that prefill still shows.
# Tokens are the router's (CHARS_PER_TOKEN characters), which engine-sim counts too: the
# workload's working set is about 97,000 tokens of distinct prefix, so a cache of 30,000 holds
# about a third of it, and the policy is told the same number.
CAPACITY_TOKENS = 30_000
ENGINE_FLAGS = [
    "--kv-capacity-tokens", str(CAPACITY_TOKENS),
    "--prefill-tokens-per-s", "25000",
    "--decode-tokens-per-s", "400",
    "--max-batch", "16",
]  # fmt: skip
# Caches hold about a third of the working set, so where a request lands decides its hits.
WORKLOAD = SyntheticSpec(
    requests=400,
    tenants=24,
    system_prompt_words=1200,
    conversations=96,
    turn_words=(40, 200),
    answer_words=(8, 24),
    rate_per_s=1000.0,
)
CONCURRENCY = 16
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=WORKLOAD.requests, help="per policy")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--port", type=int, default=0, help="gateway port (0: a free one)")
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="instead: kv-aware approximate against precise (the engines' KV cache events), "
        "with traffic bypassing the router and one engine reset half-way",
    )
    parser.add_argument(
        "--bypass-share",
        type=float,
        default=0.2,
        help="with --kv-events: share of requests sent straight to the engines (default: 0.2)",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str


@contextlib.contextmanager
def _processes() -> Iterator[list[_Proc]]:
    procs: list[_Proc] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.popen.wait(10)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)


def _start(procs: list[_Proc], name: str, args: Sequence[str], log: Path, port: int = 0) -> _Proc:
    port = port or _free_port()
    cmd = [sys.executable, "-m", "router.cli", *args, "--host", LOOPBACK, "--port", str(port)]
    with log.open("ab") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    p = _Proc(name, popen, f"http://{LOOPBACK}:{port}")
    procs.append(p)
    return p


async def _wait_ok(session: aiohttp.ClientSession, p: _Proc, path: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if p.popen.poll() is not None:
            raise RuntimeError(f"{p.name} exited early; see {log}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(p.url + path) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{p.name} not ready after 30 s; see {log}")


def _client(concurrency: int) -> aiohttp.ClientSession:
    """The demo's HTTP client: room for the workload's concurrency, a bound on every call."""
    timeout = aiohttp.ClientTimeout(total=120)
    return aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency * 2)
    )


async def _wait_fleet(
    session: aiohttp.ClientSession, engines: Sequence[_Proc], gateway: _Proc, log: Path
) -> None:
    """Every engine answering /health, then the gateway /ready."""
    for e in engines:
        await _wait_ok(session, e, "/health", log)
    await _wait_ok(session, gateway, "/ready", log)


@dataclass
class PhaseResult:
    policy: str
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    ttfts: list[float] | None = None

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


async def _one(
    session: aiohttp.ClientSession, url: str, req: TraceRequest, out: PhaseResult
) -> None:
    body = dict(req.request_body())
    body.update(model="sim-model", stream=True, stream_options={"include_usage": True})
    headers = {"x-session-id": req.session} if req.session else {}
    t0 = time.perf_counter()
    first: float | None = None
    decoder = Decoder()
    try:
        async with session.post(
            f"{url}/v1/chat/completions", data=orjson.dumps(body), headers=headers
        ) as r:
            if r.status != 200:
                out.failed += 1
                return
            async for chunk in r.content.iter_any():
                for ev in decoder.feed(chunk):
                    if ev.done:
                        continue
                    msg = orjson.loads(ev.data)
                    if first is None and msg.get("choices"):
                        first = time.perf_counter() - t0
                    usage = msg.get("usage")
                    if usage:
                        out.prompt_tokens += usage.get("prompt_tokens", 0)
                        details = usage.get("prompt_tokens_details") or {}
                        out.cached_tokens += details.get("cached_tokens", 0)
    except (TimeoutError, aiohttp.ClientError):
        out.failed += 1
        return
    out.requests += 1
    assert out.ttfts is not None
    out.ttfts.append(first if first is not None else time.perf_counter() - t0)


class _Progress:
    """Requests done in a phase: on a terminal one line updates in place; in a log, a line per
    quarter."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.tty = sys.stdout.isatty()
        self.lead, self.tail, self.step = (
            ("\r", "", 20) if self.tty else ("", "\n", max(1, total // 4))
        )

    def tick(self) -> None:
        self.done += 1
        if self.done % self.step == 0 or self.done == self.total:
            line = f"{self.lead}  {self.label:>12}: {self.done}/{self.total} requests"
            print(line, end=self.tail, flush=True)

    def close(self) -> None:
        if self.tty:
            print()


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    trace: list[TraceRequest],
    policy: str,
    concurrency: int,
) -> PhaseResult:
    out = PhaseResult(policy, ttfts=[])
    queue: asyncio.Queue[TraceRequest] = asyncio.Queue()
    # Requests start in arrival order, up to ``concurrency`` at once.
    for r in trace:
        queue.put_nowait(r)
    progress = _Progress(policy, len(trace))

    async def worker() -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await _one(session, url, req, out)
            progress.tick()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.seconds = time.perf_counter() - t0
    progress.close()
    return out


async def _wait_reload(session: aiohttp.ClientSession, url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    line = 'kvrouter_policy_reloads_total{result="success"}'
    while time.monotonic() < deadline:
        async with session.get(f"{url}/metrics") as r:
            for text in (await r.text()).splitlines():
                if text.startswith(line) and float(text.split()[-1]) >= count:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not pick up the new policy within 20 s")


def _install_policy(preset: str, dest: Path) -> None:
    """Write a preset as the live policy file, told the engines' real cache size (as an
    operator would set engine_capacity_tokens), through a rename so the watcher never reads
    half a file."""
    text = preset_text(preset, {"index.engine_capacity_tokens": CAPACITY_TOKENS})
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(dest)


def _ms(ttfts: list[float] | None, q: float) -> str:
    return f"{percentile(ttfts or [], q) * 1000:.0f} ms"


def _table(rows: list[PhaseResult]) -> str:
    head = ["policy", "requests", "failed", "hit ratio", "TTFT p50", "TTFT p99", "req/s"]
    body = [
        [
            r.policy,
            str(r.requests),
            str(r.failed),
            f"{r.hit_ratio:.3f}",
            _ms(r.ttfts, 50),
            _ms(r.ttfts, 99),
            f"{r.requests / r.seconds:.1f}" if r.seconds else "-",
        ]
        for r in rows
    ]
    return _grid(head, body)


def _grid(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *body]
    )


async def _main(args: argparse.Namespace, workdir: Path) -> list[PhaseResult]:
    spec = dataclasses.replace(WORKLOAD, requests=args.requests)
    trace = list(synthetic(spec))
    log = workdir / "demo.log"
    policy_file = workdir / "policy.yaml"
    _install_policy("round-robin", policy_file)
    with _processes() as procs:
        print(f"starting {ENGINES} engine-sims and the gateway (logs: {log})")
        engines = [
            _start(procs, f"engine-{i}", ["engine-sim", *ENGINE_FLAGS], log) for i in range(ENGINES)
        ]
        backends = [a for e in engines for a in ("--backend", e.url)]
        gateway_args = ["serve", *backends, "--policy", str(policy_file)]
        gateway = _start(procs, "gateway", gateway_args, log, args.port)
        async with _client(args.concurrency) as session:
            await _wait_fleet(session, engines, gateway, log)
            print(f"gateway {gateway.url} in front of {', '.join(e.url for e in engines)}")
            results = [await _drive(session, gateway.url, trace, "round-robin", args.concurrency)]
            print("hot-reloading the policy file to kv-aware and clearing the engines' caches")
            for e in engines:
                async with session.post(f"{e.url}/reset") as r:
                    r.raise_for_status()
            _install_policy("kv-aware", policy_file)
            await _wait_reload(session, gateway.url, 1)
            results.append(await _drive(session, gateway.url, trace, "kv-aware", args.concurrency))
    return results


def _in_workdir(main: Callable[[Path], Coroutine[Any, Any, T]]) -> T | None:
    """``main`` run in a temporary folder; on failure, why and the log's tail, and None."""
    with tempfile.TemporaryDirectory(prefix="kvrouter-demo-") as tmp:
        try:
            return asyncio.run(main(Path(tmp)))
        except (RuntimeError, OSError) as e:
            print(f"\ndemo failed: {e}", file=sys.stderr)
            log = Path(tmp) / "demo.log"
            if log.exists():
                print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
            return None


def run(args: argparse.Namespace) -> int:
    if args.kv_events:
        # Imported here: that mode is built on this module's helpers.
        from router.commands import demo_kv_events

        return demo_kv_events.run(args)
    results = _in_workdir(lambda workdir: _main(args, workdir))
    if results is None:
        return 1
    print()
    print(_table(results))
    rr, kv = results
    if rr.hit_ratio > 0:
        print(
            f"\nkv-aware reused {kv.hit_ratio / rr.hit_ratio:.1f}x the prompt tokens "
            "round-robin did"
        )
    return 0 if not rr.failed and not kv.failed else 1
