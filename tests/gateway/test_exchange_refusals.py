"""Requests the gateway refuses before any engine sees them, each in OpenAI's error shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.gateway.inbound import body as body_module
from tests.fakes import FakeEngine
from tests.gateway.rig import CHAT, A, chat, rig


async def test_exchange_body_over_limit_413(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, chat("x" * 5000))
        assert status == 413 and body["error"]["code"] == "request_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        async with r.client.post(CHAT, data=chunks()) as resp:
            assert resp.status == 413
        assert r.up.sent == []


async def test_exchange_unknown_model_404_openai_shape(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, {**chat(), "model": "gpt-nope"})
        assert status == 404
        assert body["error"]["param"] == "model" and body["error"]["code"] == "model_not_found"
        assert body["error"]["type"] == "invalid_request_error"


async def test_exchange_bad_json_400_says_what(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, b'{"model": "m", "messages": [}')
        assert status == 400 and "not valid JSON" in body["error"]["message"]
        status, body = await r.post(
            CHAT, {"model": "m", "messages": [{"role": "user"}], "stream": 1}
        )
        assert status == 400 and body["error"]["param"] == "stream"


async def test_exchange_no_healthy_backend_503_retry_after(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, down=True), ready=False) as r:
        async with r.client.post(CHAT, json=chat()) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"].isdigit()
            body = await resp.json()
        assert body["error"]["code"] == "no_backend_available"


async def test_unknown_route_and_method_openai_shape(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post("/v1/nothing", chat())
        assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
        async with r.client.get(CHAT) as resp:
            assert resp.status == 405
            assert (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_exchange_body_trickling_past_deadline_408(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(body_module, "BODY_READ_SECONDS", 0.1)
    async with rig(tmp_path) as r:

        async def trickle() -> AsyncIterator[bytes]:
            yield b'{"model": "m", '
            await asyncio.sleep(0.5)
            yield b'"messages": [{"role": "user", "content": "x"}]}'

        async with r.client.post(CHAT, data=trickle()) as resp:
            assert resp.status == 408
            assert (await resp.json())["error"]["code"] == "request_timeout"
        assert r.up.sent == []
