"""What both ``kvrouter demo`` modes share: the engines, the workload, the client that drives
it, and the way results are printed.

The fleet is four engine-sims and a gateway as real processes (router.commands.fleet); the
workload is a multi-tenant, multi-turn chat, streamed, whose every response's usage says how
many prompt tokens the engine found cached.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson

from router.commands.fleet import Proc, metric, wait_ready
from router.core.stats import percentile
from router.core.workload import SyntheticSpec, TraceRequest
from router.gateway.openai.sse import Decoder
from router.presets import preset_text

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
LOG_NAME = "demo.log"
T = TypeVar("T")


def client(concurrency: int) -> aiohttp.ClientSession:
    """The demo's HTTP client: room for the workload's concurrency, a bound on every call."""
    timeout = aiohttp.ClientTimeout(total=120)
    return aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency * 2)
    )


async def wait_fleet(engines: Sequence[Proc], gateway: Proc) -> None:
    """Every engine answering /health, then the gateway /ready."""
    # The blocking poll runs off the event loop, which stays free for the client.
    for e in engines:
        await asyncio.to_thread(wait_ready, f"{e.url}/health", proc=e)
    await asyncio.to_thread(wait_ready, f"{gateway.url}/ready", proc=gateway)


@dataclass
class PhaseResult:
    """One stream of requests as the client saw it: counts, tokens, time, TTFTs."""

    policy: str
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    # The router's own routing-quality counters over the phase (``router_quality``).
    quality: dict[str, float] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def share(self, counter: str) -> str:
        """``counter``'s tokens over the phase's prompt tokens (``-``: not counted)."""
        tokens = self.quality.get(counter)
        if tokens is None or not self.prompt_tokens:
            return "-"
        return f"{tokens / self.prompt_tokens:.3f}"


QUALITY = ("reachable", "routed", "achieved")


def router_quality(gateway: Proc) -> dict[str, float]:
    """The router's prefix tokens so far, all engines summed: reachable, routed, achieved
    (``kvrouter_prefix_*_tokens_total``)."""
    return {q: metric(gateway, f"kvrouter_prefix_{q}_tokens_total") for q in QUALITY}


async def counting_quality(gateway: Proc, phase: Coroutine[Any, Any, PhaseResult]) -> PhaseResult:
    """Run ``phase``, and give its result the router's routing-quality counts over it."""
    before = await asyncio.to_thread(router_quality, gateway)
    out = await phase
    after = await asyncio.to_thread(router_quality, gateway)
    out.quality = {q: after[q] - before[q] for q in QUALITY}
    return out


async def send(
    session: aiohttp.ClientSession, url: str, req: TraceRequest, out: PhaseResult
) -> None:
    """Stream ``req`` to ``url`` and count what came back into ``out``."""
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
    out.ttfts.append(first if first is not None else time.perf_counter() - t0)


class Progress:
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


def install_policy(preset: str, dest: Path) -> None:
    """Write a preset as the live policy file, told the engines' real cache size (as an
    operator would set engine_capacity_tokens), through a rename so the watcher never reads
    half a file."""
    text = preset_text(preset, {"index.engine_capacity_tokens": CAPACITY_TOKENS})
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(dest)


def ms(ttfts: list[float], q: float) -> str:
    return f"{percentile(ttfts, q) * 1000:.0f} ms"


def grid(head: list[str], body: list[list[str]]) -> str:
    """Rows as left-aligned columns, each as wide as its widest cell."""
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *body]
    )


def in_workdir(main: Callable[[Path], Coroutine[Any, Any, T]]) -> T | None:
    """``main`` run in a temporary folder; on failure, why and the log's tail, and None."""
    with tempfile.TemporaryDirectory(prefix="kvrouter-demo-") as tmp:
        try:
            return asyncio.run(main(Path(tmp)))
        except (RuntimeError, OSError) as e:
            print(f"\ndemo failed: {e}", file=sys.stderr)
            log = Path(tmp) / LOG_NAME
            if log.exists():
                print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
            return None
