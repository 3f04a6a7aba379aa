"""Fakes shared by the gateway's tests: an in-memory ``Upstream`` with scriptable engines.

``FakeUpstream`` stands where ``HttpUpstream`` stands. Each ``FakeEngine`` answers health
probes and model lists, and answers proxied requests from a queue of ``Script`` steps (one per
request; an empty queue answers normally: an OpenAI response with usage, streamed when the body
asks for it). Every response it hands out is tracked, so a test can check that each one was
released or aborted, and which engine saw which request bytes.

The tests' one clock is ``router.gossip.clock.ManualClock``: the gossip layer takes it as its
``Clock``, and calling it gives the ``Callable[[], float]`` the gateway takes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

from router.gateway.openai import sse
from router.gateway.openai.errors import UpstreamConnectError, UpstreamDropped, UpstreamTimeout
from router.gateway.upstream.client import UpstreamRequest, UpstreamResponse

JSON = {"Content-Type": "application/json"}
SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class Script:
    """What a fake engine does with one request."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: dict(JSON))
    chunks: list[bytes] = field(default_factory=list)
    connect_error: bool = False
    hang: bool = False  # no status line until the caller gives up
    hang_after: int | None = None  # send this many chunks, then nothing more
    drop_after: int | None = None  # send this many chunks, then break the connection
    gate: asyncio.Event | None = None  # the answer's first chunk waits until this is set


def openai_answer(body: Mapping[str, Any], cached: int = 0, prompt: int = 10) -> Script:
    """A normal answer to ``body``: streamed (with a usage event when asked) or whole."""
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": 2,
        "total_tokens": prompt + 2,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if body.get("stream") is True:
        chunks = [
            sse.encode(orjson.dumps({"choices": [{"index": 0, "delta": {"content": w}}]}))
            for w in ("hello", " world")
        ]
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            chunks.append(sse.encode(orjson.dumps({"choices": [], "usage": usage})))
        chunks.append(sse.DONE)
        return Script(headers=dict(SSE), chunks=chunks)
    answer = {"object": "chat.completion", "choices": [], "usage": usage}
    return Script(chunks=[orjson.dumps(answer)])


def error_answer(status: int, message: str = "injected") -> Script:
    err = {"error": {"message": message, "type": "Error", "param": None, "code": status}}
    return Script(status=status, chunks=[orjson.dumps(err)])


class FakeResponse:
    """An ``UpstreamResponse`` playing one ``Script``."""

    def __init__(self, engine: str, script: Script) -> None:
        self.engine = engine
        self.script = script
        self._headers = CIMultiDictProxy(CIMultiDict(script.headers))
        self._sent = 0
        self.released = False
        self.aborted = False

    @property
    def status(self) -> int:
        return self.script.status

    @property
    def headers(self) -> MultiMapping[str]:
        return self._headers

    async def read_chunk(self) -> bytes:
        s = self.script
        await asyncio.sleep(0)  # a real read yields to the loop
        if s.gate is not None and self._sent == 0:
            await s.gate.wait()
        if s.drop_after is not None and self._sent >= s.drop_after:
            raise UpstreamDropped(f"{self.engine} broke off its response (fake)", self.engine)
        if s.hang_after is not None and self._sent >= s.hang_after:
            await asyncio.Event().wait()  # until the caller's timeout cancels us
        if self._sent >= len(s.chunks):
            return b""
        self._sent += 1
        return s.chunks[self._sent - 1]

    def finished(self) -> bool:
        s = self.script
        pending = s.drop_after is not None or s.hang_after is not None
        return not pending and self._sent >= len(s.chunks)

    def release(self) -> None:
        self.released = True

    def abort(self) -> None:
        self.aborted = True


@dataclass
class FakeEngine:
    """One scripted engine: health, models, and a queue of answers."""

    url: str
    models: list[str] = field(default_factory=lambda: ["m"])
    health_status: int = 200
    down: bool = False  # every call fails to connect
    failing: int = 0  # when set, every request is answered with this status (an engine bug)
    cached: int = 0
    metrics: tuple[int, bytes] = (404, b"")  # what GET /metrics answers
    scripts: deque[Script] = field(default_factory=deque)
    requests: list[UpstreamRequest] = field(default_factory=list)
    fetched: list[tuple[str, bytes]] = field(default_factory=list)  # POSTs by fetch: path, body
    hang_fetch: bool = False  # a POST by fetch never answers (until the caller gives up)

    def answer(self, request: UpstreamRequest) -> Script:
        if self.scripts:
            return self.scripts.popleft()
        if self.failing:
            return error_answer(self.failing, "the engine is broken")
        return openai_answer(orjson.loads(request.body), self.cached)


class FakeUpstream:
    """``Upstream`` over in-memory ``FakeEngine``s, keyed by base URL."""

    def __init__(self, *engines: FakeEngine) -> None:
        self.engines = {e.url: e for e in engines}
        self.responses: list[FakeResponse] = []
        self.closed = False
        # Scripts for the next sends, whichever engine they go to (before engines' own).
        self.upcoming: deque[Script] = deque()
        self.sent: list[str] = []  # engine of each send, in order

    def next(self, *scripts: Script) -> None:
        """The next sends play ``scripts`` in order, whichever engine the router picks."""
        self.upcoming.extend(scripts)

    def add(self, engine: FakeEngine) -> FakeEngine:
        self.engines[engine.url] = engine
        return engine

    def unfinished(self) -> list[FakeResponse]:
        """Responses neither released nor aborted (each one would leak a connection)."""
        return [r for r in self.responses if not (r.released or r.aborted)]

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        engine = self.engines.get(request.engine)
        if engine is None or engine.down:
            self.sent.append(request.engine)
            raise UpstreamConnectError(f"cannot connect to {request.engine} (fake)")
        engine.requests.append(request)
        self.sent.append(request.engine)
        script = self.upcoming.popleft() if self.upcoming else engine.answer(request)
        if script.connect_error:
            raise UpstreamConnectError(f"cannot connect to {request.engine} (fake)")
        if script.hang:
            await asyncio.Event().wait()
        resp = FakeResponse(request.engine, script)
        self.responses.append(resp)
        return resp

    async def fetch(
        self,
        engine: str,
        path: str,
        seconds: float,
        body: bytes | None = None,
        limit: int = 0,
    ) -> tuple[int, bytes]:
        fake = self.engines.get(engine)
        if fake is None:
            raise UpstreamConnectError(f"cannot connect to {engine} (fake)")
        if fake.down:
            raise UpstreamTimeout(f"GET {engine}{path} timed out after {seconds:g}s (fake)")
        if body is not None:
            fake.fetched.append((path, body))
            if fake.hang_fetch:
                await asyncio.Event().wait()
            return 200, b""
        if path == "/v1/models":
            cards = [{"id": m, "object": "model", "owned_by": "fake"} for m in fake.models]
            return 200, orjson.dumps({"object": "list", "data": cards})
        if path == "/metrics":
            return fake.metrics
        return fake.health_status, b""

    async def close(self) -> None:
        self.closed = True
