"""The gateway's memory and event loop under large request bodies and large answers.

Starts ``kvrouter engine-sim --fast`` and, for each case, a fresh ``kvrouter serve`` in front of
it with ``limits.max_body_bytes`` set to the body size, then sends ``--bodies`` bodies at once,
each just under that limit:

- ``tokens``: completions whose prompt is token ids (7 bytes of JSON each, a Python int each
  once parsed: the largest growth from bytes to objects);
- ``messages``: chat requests of many one-word messages (a dict per message);
- ``users``: ``--bodies`` x 4 chats one after another, each with a different ``user`` string
  just under the limit (session affinity keys sessions by it: growth is what the router keeps);
- ``answers``: ``--answers`` small chats at once, each answered with a ``--answer-mib``
  non-streamed body by an engine of this module (``huge_engine``) instead of engine-sim.

It reads the router's resident memory from /proc/PID/status (Linux only): VmRSS before the
bodies (after one small request), and the peak, VmHWM, after all of them were answered. Growth
is the peak minus the baseline. Meanwhile a thread asks GET /health every 20 ms; the longest
answer shows how long the event loop was blocked.

``--checkout DIR`` runs kvrouter from another copy of the source (for example an unpacked
``git archive`` of an older commit), to compare before and after a change on one machine.

    python -m bench.memory [--bodies 8] [--body-mib 16] [--answers 4] [--answer-mib 200]
                           [--cases tokens messages users answers] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from router.commands.fleet import KVROUTER, Proc, running, start_ready
from router.hostport import LOOPBACK, free_port

# The source tree this bench belongs to: kvrouter runs from it unless --checkout says otherwise.
CHECKOUT = Path(__file__).resolve().parent.parent

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


def user_bodies(limit: int, n: int) -> list[bytes]:
    """``n`` small chats, each with its own ``user`` string of about ``limit`` bytes."""
    return [
        orjson.dumps(
            {
                "model": "sim-model",
                "messages": [{"role": "user", "content": "hi"}],
                "user": f"{i:08d}" + "u" * (limit - 300),
                "max_tokens": 1,
            }
        )
        for i in range(n)
    ]


BODIES = {
    "tokens": ("/v1/completions", token_body),
    "messages": ("/v1/chat/completions", messages_body),
}
CASES = [*BODIES, "users", "answers"]
SESSION_POLICY = """
name: sessions
scorers:
  - {type: session-affinity, weight: 10, user_field: true}
  - {type: load, weight: 1}
"""


@contextlib.contextmanager
def huge_engine(answer_bytes: int) -> Iterator[str]:
    """An OpenAI-compatible engine on loopback whose every chat answer is ``answer_bytes``
    long (sent in 1 MiB writes with its Content-Length), in a thread; yields its URL."""
    head = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,'
    head += b'"message":{"role":"assistant","content":"'
    tail = b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    tail += b'"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}'
    filler = answer_bytes - len(head) - len(tail)
    piece = b"x" * MIB

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        out.content_length = answer_bytes
        await out.prepare(request)
        await out.write(head)
        for _ in range(filler // MIB):
            await out.write(piece)
        await out.write(piece[: filler % MIB] + tail)
        return out

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim-model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", chat),
                web.get("/v1/models", models),
                web.get("/health", health),
            ]
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, port).start()
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(serve())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


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


async def send_all(url: str, path: str, bodies: list[bytes]) -> Counter[int]:
    """Every body of ``bodies`` at once; the statuses they were answered with."""
    timeout = aiohttp.ClientTimeout(total=600)
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def one(body: bytes) -> int:
            async with http.post(url + path, data=io.BytesIO(body), headers=headers) as r:
                async for _ in r.content.iter_chunked(MIB):
                    pass  # read at full speed, keep nothing
                return r.status

        return Counter(await asyncio.gather(*(one(body) for body in bodies)))


def run_case(
    case: str, engine: str, tmp: Path, procs: list[Proc], args: argparse.Namespace
) -> dict[str, object]:
    limit = args.body_mib * MIB
    small = orjson.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "x"}]})
    if case == "answers":
        path, bodies = "/v1/chat/completions", [small] * args.answers
    elif case == "users":
        path, bodies = "/v1/chat/completions", user_bodies(limit, 4 * args.bodies)
    else:
        path, make = BODIES[case]
        bodies = [make(limit)] * args.bodies
    config = tmp / f"serve-{case}.yaml"
    config.write_text(f"limits: {{max_body_bytes: {limit}}}\n")
    if case == "users":  # sessions keyed by the body's user field
        policy = tmp / "sessions.yaml"
        policy.write_text(SESSION_POLICY)
        config.write_text(f"limits: {{max_body_bytes: {limit}}}\npolicy: {policy}\n")
    command, cwd, env = KVROUTER, CHECKOUT, None
    if args.checkout:
        cwd = Path(args.checkout).resolve()
        env = {"PYTHONPATH": str(cwd)}
    router = start_ready(
        ["serve", "--config", str(config), "--host", LOOPBACK, "--backend", engine],
        tmp,
        ready_path="/ready",
        command=command,
        cwd=cwd,
        env=env,
    )
    procs.append(router)
    pid = router.popen.pid
    asyncio.run(send_all(router.url, "/v1/chat/completions", [small]))
    baseline = status_kib(pid, "VmRSS")
    probe = HealthProbe(router.url)
    probe.start()
    try:
        if case == "users":  # one at a time: what stays is what the router keeps
            statuses = Counter[int]()
            for body in bodies:
                statuses += asyncio.run(send_all(router.url, path, [body]))
        else:
            statuses = asyncio.run(send_all(router.url, path, bodies))
    finally:
        probe.stop.set()
        probe.join()
    peak = status_kib(pid, "VmHWM")
    after = status_kib(pid, "VmRSS")
    router.stop()
    procs.remove(router)
    return {
        "case": case,
        "body_mib": (args.answer_mib if case == "answers" else len(bodies[0]) / MIB),
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
    p.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    p.add_argument("--answers", type=int, default=4, help="large answers at once")
    p.add_argument("--answer-mib", type=int, default=200, help="size of each large answer")
    p.add_argument("--checkout", help="run kvrouter from this source tree instead")
    args = p.parse_args(argv)
    if not Path("/proc/self/status").exists():
        print("bench.memory needs Linux /proc", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        tmp_path = Path(tmp)
        engine = start_ready(["engine-sim", "--fast"], tmp_path)
        procs.append(engine)
        for case in args.cases:
            if case == "answers":
                with huge_engine(args.answer_mib * MIB) as url:
                    rows.append(run_case(case, url, tmp_path, procs, args))
            else:
                rows.append(run_case(case, engine.url, tmp_path, procs, args))
    source = args.checkout or os.path.relpath(CHECKOUT)
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
