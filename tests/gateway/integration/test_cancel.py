"""Cancellation reaches the engine: a client that leaves, at any point, stops the engine's work.

Real engine-sims behind ``kvrouter serve``. A ``vllm`` engine-sim stops a request when its
connection closes; an ``sglang`` one generates on until ``POST /abort_request`` names the
request's rid (router.enginesim.cancel). Engines are slow on purpose (a few tokens a second,
or a long prefill), so a client can leave while queued in admission, before the first byte
and mid-stream. In every phase the engine generates at most one more chunk's worth of tokens
than the client received (one token a write at these rates), and the gateway's in-flight
gauges and queue go back to zero. Nothing asserts on durations: waits are ``eventually``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.gateway.openai.sse import Decoder
from tests.gateway.integration import MODEL
from tests.gateway.integration.test_gateway import assert_inflight_zero
from tests.support import (
    Proc,
    ametric,
    eventually,
    http_json,
    readiness,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

COMPLETIONS = "/v1/completions"
# At most this many tokens may be generated after the client received its last one.
CHUNK = 1
# Two tokens a second: the engine is far from done when the client leaves.
SLOW_DECODE = ("--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", "2")
# A 2000-token prompt at 100 tokens a second: twenty seconds before the first token.
SLOW_PREFILL = ("--prefill-tokens-per-s", "100", "--decode-tokens-per-s", "2")
LONG_PROMPT = " ".join(f"w{i:03d}" for i in range(1600))

CONFIG = """
engines:
  static: [{{url: "{url}", kind: {kind}}}]
flow_control: {{max_inflight_per_engine: 1, max_wait_seconds: 60}}
timeouts: {{first_byte_seconds: 60}}
"""


def start(
    tmp: Path, procs: list[Proc], kind: str, engine_args: tuple[str, ...], told: str
) -> tuple[Proc, Proc]:
    """An engine-sim of ``kind`` and a router that knows it as ``told``."""
    engine = start_kvrouter(["engine-sim", "--kind", kind, *engine_args], tmp)
    procs.append(engine)
    config = tmp / "serve.yaml"
    config.write_text(CONFIG.format(url=engine.url, kind=told))
    router = start_kvrouter(["serve", "--config", str(config), "--host", "127.0.0.1"], tmp)
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] == 1, "the engine healthy")
    return engine, router


def stats(engine: Proc) -> dict[str, Any]:
    got: dict[str, Any] = http_json(f"{engine.url}/stats")
    return got


def body(prompt: str = "q", max_tokens: int = 200) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}


async def read_tokens(resp: aiohttp.ClientResponse, n: int) -> int:
    """Read the stream until ``n`` tokens arrived; the tokens received."""
    decoder, got = Decoder(), 0
    async for chunk in resp.content.iter_any():
        for event in decoder.feed(chunk):
            if not event.done and json.loads(event.data)["choices"][0]["text"]:
                got += 1
        if got >= n:
            break
    return got


async def ended(engine: Proc) -> dict[str, Any]:
    """The engine's stats once nothing runs or waits there (bounded)."""

    def idle() -> dict[str, Any]:
        s = stats(engine)
        assert s["running"] == s["waiting"] == 0, s
        return s

    return await eventually(idle, timeout=15)


async def settled(router: Proc) -> None:
    assert await ametric(router, "kvrouter_queue_depth") == 0
    assert_inflight_zero(router)


def generated(s: dict[str, Any]) -> int:
    """Every token the engine generated: those it sent, and those after its client left."""
    total: int = s["completion_tokens"] + s["tokens_after_disconnect"]
    return total


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_client_leaving_mid_stream_stops_the_engine(
    tmp_path: Path, procs: list[Proc], kind: str
) -> None:
    engine, router = start(tmp_path, procs, kind, SLOW_DECODE, told=kind)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{router.url}{COMPLETIONS}", json=body())
        received = await read_tokens(resp, 2)
        resp.close()
    s = await ended(engine)
    assert received == 2
    assert generated(s) <= received + CHUNK, s
    assert s["aborted"] == (1 if kind == "sglang" else 0)
    await settled(router)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_client_leaving_before_the_first_byte_stops_the_engine(
    tmp_path: Path, procs: list[Proc], kind: str
) -> None:
    engine, router = start(tmp_path, procs, kind, SLOW_PREFILL, told=kind)
    async with aiohttp.ClientSession() as http:
        sent = asyncio.ensure_future(
            http.post(f"{router.url}{COMPLETIONS}", json=body(LONG_PROMPT))
        )
        await eventually(lambda: stats(engine)["running"] + stats(engine)["waiting"] == 1)
        assert not sent.done()  # the engine has it, the client has no byte yet
        sent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sent
    s = await ended(engine)
    assert generated(s) <= CHUNK, s
    assert (s["requests"], s["aborted"]) == (1, 1 if kind == "sglang" else 0)
    await settled(router)


async def test_client_leaving_the_admission_queue_never_reaches_the_engine(
    tmp_path: Path, procs: list[Proc]
) -> None:
    engine, router = start(tmp_path, procs, "sglang", SLOW_DECODE, told="sglang")
    async with aiohttp.ClientSession() as http:
        first = await http.post(f"{router.url}{COMPLETIONS}", json=body())
        await read_tokens(first, 1)  # the engine's one slot is taken
        queued = asyncio.ensure_future(http.post(f"{router.url}{COMPLETIONS}", json=body("q2")))
        await eventually(lambda: ametric(router, "kvrouter_queue_depth"))
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued

        async def queue_empty() -> bool:
            return await ametric(router, "kvrouter_queue_depth") == 0

        await eventually(queue_empty)
        first.close()
    s = await ended(engine)
    assert s["requests"] == 1, "the queued request never reached the engine"
    await settled(router)


async def test_sglang_engine_not_told_its_kind_generates_on_after_the_client_left(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """The control: without ``kind: sglang`` no abort goes out, and the closed connection alone
    leaves such an engine generating for nobody."""
    engine, router = start(tmp_path, procs, "sglang", SLOW_DECODE, told="vllm")
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{router.url}{COMPLETIONS}", json=body())
        await read_tokens(resp, 2)
        resp.close()
    await eventually(lambda: stats(engine)["disconnected"] == 1)
    await asyncio.sleep(1.0)  # two decode steps with nobody reading
    s = stats(engine)
    assert (s["running"], s["aborted"]) == (1, 0)
    assert await ametric(router, "kvrouter_engine_aborts_total", result="sent") == 0
    await settled(router)
