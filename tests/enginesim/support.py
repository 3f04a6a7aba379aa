"""Helpers for engine-sim's tests: prompts of a known size, bodies, and an engine on loopback.

Prompts are sized in tokens of the router's unit: ``prompt(n)`` is exactly ``n`` tokens of
``CHARS_PER_TOKEN`` characters, and ``prompt(n, start)`` differs from ``prompt(n)`` in its
first token, so tests can build shared and unshared prefixes by count.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from router.core.blocks import CHARS_PER_TOKEN
from router.enginesim.app import serving
from router.enginesim.engine import DEFAULT_MODEL, SimSettings
from router.gateway.openai.sse import Decoder, Event
from tests.support import eventually

MODEL = DEFAULT_MODEL
FAST = SimSettings(fast=True)
ERROR_KEYS = {"message", "type", "param", "code"}
_DIGITS = CHARS_PER_TOKEN - 1


def prompt(n: int, start: int = 0) -> str:
    """A text prompt of exactly ``n`` tokens, token ``i`` spelled ``t`` and ``start + i``."""
    assert start + n <= 10**_DIGITS, "token numbers must fit the token's width"
    return "".join(f"t{i:0{_DIGITS}d}" for i in range(start, start + n))


def chat(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def completion(text: Any = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": text, **extra}


def raw(body: Any) -> bytes:
    """A body as a client sends it (bytes are sent as they are)."""
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def cached(body: dict[str, Any]) -> int:
    value: int = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return value


@asynccontextmanager
async def engine(settings: SimSettings = FAST) -> AsyncIterator[aiohttp.ClientSession]:
    """An in-process engine and a client session whose relative URLs point at it."""
    async with serving(settings) as url, aiohttp.ClientSession(url) as http:
        yield http


async def post(http: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with http.post(path, data=raw(body)) as resp:
        return resp.status, await resp.json(content_type=None)


async def get_json(http: aiohttp.ClientSession, path: str) -> Any:
    async with http.get(path) as resp:
        assert resp.status == 200
        return await resp.json()


async def stream_events(http: aiohttp.ClientSession, path: str, body: Any) -> list[Event]:
    async with http.post(path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        decoder = Decoder()
        events = [e async for chunk in resp.content.iter_any() for e in decoder.feed(chunk)]
        assert not decoder.pending
        return events


async def wait_for_stats(
    http: aiohttp.ClientSession, key: str, value: int, limit_s: float = 10.0
) -> dict[str, Any]:
    """Poll /stats until ``key`` equals ``value`` (bounded); return those stats."""

    async def stats() -> dict[str, Any]:
        got: dict[str, Any] = await get_json(http, "/stats")
        assert got[key] == value, f"/stats {key} is not {value}: {got}"
        return got

    return await eventually(stats, timeout=limit_s, interval=0.02)


def payloads(events: list[Event]) -> list[dict[str, Any]]:
    assert events[-1].done
    return [json.loads(e.data) for e in events[:-1]]
