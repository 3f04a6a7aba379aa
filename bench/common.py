"""Pieces the gateway benchmarks share: CPU clocks, chat bodies, streamed timings, drivers,
gossiping replicas, a cheap tokenizer, and the report's markdown.

Processes (start, wait, stop, free ports, metrics) come from the package's fleet module,
router.commands.fleet, as the demo's and the tests' do.

Timings are taken at the client: a streamed request's TTFT is the time from sending it to the
first ``data:`` bytes, its total time runs to the end of the stream. CPU time is read from
/proc (Linux only): utime + stime of a process, or of a process and all its descendants.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import orjson
from tokenizers import Tokenizer, models, pre_tokenizers

from router.commands.fleet import Proc, metric
from router.gateway.openai.sse import Decoder
from router.gateway.upstream.headers import usage_counts

CHAT = "/v1/chat/completions"
# The secret the benchmarks' gossiping replicas share; they never leave loopback.
GOSSIP_SECRET = "replicas-hit-ratio-bench-secret-0123"
CLK_TCK = os.sysconf("SC_CLK_TCK")

UNK = "<unk>"

# A body factory: request number -> JSON body.
BodyFor = Callable[[int], dict[str, object]]


def _stat_fields(pid: int) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses; everything after its closing
    # parenthesis is space-separated, starting with the state (field 3) at index 0.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = _stat_fields(pid)
    # utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and every live descendant, plus the children they have reaped."""
    tree = _children()
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat_fields(p)
        except OSError:
            continue
        # utime, stime, cutime, cstime: fields 14 to 17.
        total += sum(int(f) for f in fields[11:15]) / CLK_TCK
        todo.extend(tree.get(p, []))
    return total


def _system(prompt_chars: int) -> str:
    return ("You are a careful assistant. " * (prompt_chars // 29 + 1))[:prompt_chars]


def chat_body(i: int, prompt_chars: int, max_tokens: int) -> dict[str, object]:
    """A streamed chat request: a shared system prompt of ``prompt_chars`` and question ``i``."""
    system = _system(prompt_chars)
    return {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {i}"},
        ],
        "max_tokens": max_tokens,
        "stream": True,
    }


def responses_body(i: int, prompt_chars: int, max_tokens: int) -> dict[str, object]:
    """``chat_body``'s request as an OpenAI Responses body (the system prompt as instructions)."""
    return {
        "model": "sim-model",
        "instructions": _system(prompt_chars),
        "input": [{"role": "user", "content": f"question {i}"}],
        "max_output_tokens": max_tokens,
        "stream": True,
    }


def messages_body(i: int, prompt_chars: int, max_tokens: int) -> dict[str, object]:
    """``chat_body``'s request as an Anthropic Messages body (the system prompt as ``system``)."""
    question = [{"type": "text", "text": f"question {i}"}]
    return {
        "model": "sim-model",
        "system": _system(prompt_chars),
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": True,
    }


def chat_usage_body(i: int, prompt_chars: int, max_tokens: int) -> dict[str, object]:
    """``chat_body`` asking for its usage event, as the other APIs' streams always send one."""
    return {**chat_body(i, prompt_chars, max_tokens), "stream_options": {"include_usage": True}}


# Each front door's path and the same streamed request in its shape (``chat-usage``: chat
# asking for the usage event the Responses and Messages streams always carry).
ROUTES: dict[str, tuple[str, Callable[[int, int, int], dict[str, object]]]] = {
    "chat": (CHAT, chat_body),
    "chat-usage": (CHAT, chat_usage_body),
    "responses": ("/v1/responses", responses_body),
    "messages": ("/v1/messages", messages_body),
}


@dataclass(frozen=True, slots=True)
class Timing:
    """One streamed request as the client saw it, in seconds."""

    ttft: float
    total: float


async def stream_timing(
    http: aiohttp.ClientSession, url: str, payload: Mapping[str, object], path: str = CHAT
) -> Timing:
    """Send a streamed request and read it to the end; raises on a non-200 answer."""
    t0 = time.perf_counter()
    first = 0.0
    async with http.post(url + path, json=payload) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            if not first and b"data:" in chunk:
                first = time.perf_counter() - t0
    return Timing(first, time.perf_counter() - t0)


async def ttft(http: aiohttp.ClientSession, url: str, payload: dict[str, object]) -> float:
    """Seconds to the first event of a streamed request (the stream is then read to its end)."""
    return (await stream_timing(http, url, payload)).ttft


async def interleaved(
    paths: Mapping[str, Callable[[int], str]], n: int, body_for: BodyFor, warmup: int = 20
) -> dict[str, list[Timing]]:
    """One request at a time, path after path for each request number, on keep-alive
    connections, so that drift in the machine's load hits every path alike."""
    out: dict[str, list[Timing]] = {name: [] for name in paths}
    async with aiohttp.ClientSession() as http:
        for i in range(warmup):  # connections, caches, the routers' indexes
            for url_for in paths.values():
                await stream_timing(http, url_for(i), body_for(i))
        for i in range(n):
            payload = body_for(i)
            for name, url_for in paths.items():
                out[name].append(await stream_timing(http, url_for(i), payload))
    return out


@dataclass
class LoadResult:
    """A closed-loop run: throughput, CPU time of the measured process tree, what failed."""

    requests: int
    seconds: float
    cpu_seconds: float | None
    failures: int
    ttfts: list[float] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_request(self) -> float | None:
        if self.cpu_seconds is None or not self.requests:
            return None
        return self.cpu_seconds * 1000 / self.requests


async def closed_loop(
    url_for: Callable[[int], str],
    total: int,
    concurrency: int,
    body_for: BodyFor,
    cpu_of: Callable[[], float] | None = None,
    path: str = CHAT,
) -> LoadResult:
    """``total`` streamed requests to ``path``, ``concurrency`` at a time; ``cpu_of`` is read
    around it."""
    queue = iter(range(total))
    failures = 0
    ttfts: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal failures
            for i in queue:
                try:
                    timing = await stream_timing(http, url_for(i), body_for(i), path)
                    ttfts.append(timing.ttft)
                except aiohttp.ClientError:
                    failures += 1

        cpu0, t0 = (cpu_of() if cpu_of else 0.0), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu1, t1 = (cpu_of() if cpu_of else 0.0), time.perf_counter()
    return LoadResult(
        requests=total - failures,
        seconds=t1 - t0,
        cpu_seconds=(cpu1 - cpu0) if cpu_of else None,
        failures=failures,
        ttfts=ttfts,
    )


@dataclass(slots=True)
class Streamed:
    """A streamed completion as the client read it."""

    status: int
    first: float | None = None  # seconds from sending to the first event
    done: bool = False  # the stream ended with [DONE]
    usage: tuple[int, int] | None = None  # (prompt tokens, cached tokens) of its usage event


async def read_stream(http: aiohttp.ClientSession, url: str, data: bytes) -> Streamed:
    """POST ``data`` (a streamed request's JSON) to ``url`` and read the answer to its end.

    Raises ``aiohttp.ClientError`` or ``TimeoutError`` as aiohttp does.
    """
    t0 = time.perf_counter()
    decoder = Decoder()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        out = Streamed(r.status)
        if r.status != 200:
            await r.read()
            return out
        async for chunk in r.content.iter_any():
            for ev in decoder.feed(chunk):
                if ev.done:
                    out.done = True
                    continue
                if out.first is None:
                    out.first = time.perf_counter() - t0
                if '"usage"' in ev.data:
                    out.usage = usage_counts(orjson.loads(ev.data).get("usage"))
    return out


async def replay_conversations(
    url: str,
    bodies: Sequence[Mapping[str, Any]],
    times: Sequence[float],
    sessions: Sequence[str | None],
    speedup: float,
) -> list[Streamed | None]:
    """Every body at its time / ``speedup``, streamed, its usage asked for; a conversation's
    turn waits for the one before (``sessions`` names each body's conversation)."""
    out: list[Streamed | None] = [None] * len(bodies)
    previous: dict[str, asyncio.Event] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
        t0 = time.perf_counter()

        async def one(i: int, body: Mapping[str, Any], before: asyncio.Event | None) -> None:
            try:
                await asyncio.sleep(max(0.0, t0 + times[i] / speedup - time.perf_counter()))
                if before is not None:
                    await before.wait()
                data = orjson.dumps(
                    {**body, "stream": True, "stream_options": {"include_usage": True}}
                )
                out[i] = await read_stream(http, url + CHAT, data)
            except (aiohttp.ClientError, TimeoutError):
                out[i] = None

        tasks = []
        for i, body in enumerate(bodies):
            conv = sessions[i] or f"request-{i}"
            before = previous.get(conv)
            ev = asyncio.Event()
            previous[conv] = ev

            async def chained(i: int = i, body: Mapping[str, Any] = body,
                              before: asyncio.Event | None = before,
                              ev: asyncio.Event = ev) -> None:  # fmt: skip
                try:
                    await one(i, body, before)
                finally:
                    ev.set()

            tasks.append(asyncio.ensure_future(chained()))
        await asyncio.gather(*tasks)
    return out


def alive_peers(proc: Proc) -> float:
    """How many gossip peers the replica ``proc`` sees alive."""
    return metric(proc, "kvrouter_gossip_peers", state="alive")


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, as bench/RESULTS.md quotes them."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def print_report(
    title: str, table: str, records: Sequence[Mapping[str, object]] | None = None
) -> None:
    """A run's report on stdout: what was run, its table, and (``--json``) its records."""
    print(f"{title}\n")
    print(table)
    if records is not None:
        print(json.dumps(list(records), indent=2))


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so ``running`` stops every process on the way out."""
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_word_tokenizer(folder: Path, corpus: Iterable[str]) -> Path:
    """A model folder whose tokenizer gives every whitespace-separated word of ``corpus`` one id
    (any other word: ``<unk>``); returns it.

    A lookup per word, several times cheaper than BPE: for benchmarks where engines and router
    share a small machine and the encode itself is not what is measured.
    """
    words = sorted({w for text in corpus for w in text.split()})
    vocab = {UNK: 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder
