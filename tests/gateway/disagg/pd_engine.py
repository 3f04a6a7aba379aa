"""A prefill or decode engine that checks what it receives: real HTTP on loopback.

It speaks one protocol (``--protocol vllm|sglang``) in one role (``--role prefill|decode|
both``) the way the real engines do, and refuses (400, saying why) what they would not take:

- vLLM: a prefill request (``kv_transfer_params.do_remote_decode``) must not stream, must ask
  one token (``max_tokens``, and ``max_completion_tokens`` when present), carry no
  ``stream_options`` nor ``min_tokens`` and name an ``X-Request-Id``; it is answered with a
  top-level ``kv_transfer_params`` naming this engine, the request's blocks and this server
  as where to pull them. A decode request (``do_remote_prefill``) pulls its blocks from the
  engine its ``kv_transfer_params`` name (``GET /kv/<request id>``), which answers only for
  the blocks it handed out under that id: so the params must arrive exactly as answered.
  Non-streamed answers carry ``"kv_transfer_params": null``, as vLLM's do.
- SGLang: a prefill or decode server takes only requests with ``bootstrap_host``,
  ``bootstrap_port`` and ``bootstrap_room``; a prefill marks the room ready on its bootstrap
  server (``--bootstrap-port``) and answers its first token, a decode waits there for its
  room (up to ``ROOM_WAIT_SECONDS``), then answers. ``POST /abort_request {"rid"}`` stops a
  request.

``GET /received`` lists the requests it got (path, headers, body with key order kept), the
rids aborted, the requests cut short (client gone or aborted) and how many came; ``POST
/fault`` queues the next generation requests' failures (``{"status": 500}``, ``{"reset":
true}``, ``{"hang": true}``) or pace (``{"token_seconds": 0.5}``); ``/metrics`` reports
``--running`` requests running besides those in flight.

    python -m tests.gateway.disagg.pd_engine --protocol vllm --role prefill --port P
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from router import hostport

MODEL = "pd-model"
ROOM_WAIT_SECONDS = 30.0
GENERATION = ("/v1/chat/completions", "/v1/completions")
KEPT_HEADERS = ("x-request-id", "authorization", "content-type")
DELAY = "token_seconds"  # a request's own pace, from a fault
MAX_TOKENS = 256  # a request's tokens: what it asks, up to this


@dataclass
class Engine:
    protocol: str
    role: str
    port: int = 0
    bootstrap_port: int = 0
    running: int = 0
    token_seconds: float = 0.0
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    received: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=500))
    aborted: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # requests that ended before their answer
    faults: deque[dict[str, Any]] = field(default_factory=deque)
    blocks: dict[str, list[int]] = field(default_factory=dict)  # request id -> handed out
    rooms: dict[int, asyncio.Event] = field(default_factory=dict)
    by_rid: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    inflight: int = 0
    total: int = 0  # generation requests received
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    def room(self, room: int) -> asyncio.Event:
        return self.rooms.setdefault(room, asyncio.Event())


ENGINE = web.AppKey("engine", Engine)


def _error(status: int, message: str) -> web.Response:
    err = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return web.json_response({"error": err} if status >= 500 else err, status=status)


def _refused(message: str) -> web.Response:
    return web.Response(
        status=400,
        body=orjson.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}}),
        content_type="application/json",
    )


def _tokens(body: dict[str, Any]) -> list[str]:
    n = body.get("max_completion_tokens") or body.get("max_tokens") or 4
    return [f" t{i}" for i in range(min(int(n), MAX_TOKENS))]


async def _answer(
    request: web.Request, e: Engine, body: dict[str, Any], extra: dict[str, Any]
) -> web.StreamResponse:
    chat = request.path == "/v1/chat/completions"
    words = _tokens(body)
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": len(words),
        "total_tokens": 40 + len(words),
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if body.get("stream") is True:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delay = request.get(DELAY, e.token_seconds)
        for w in words:
            if delay:
                await asyncio.sleep(delay)
            part = {"index": 0, "delta": {"content": w}} if chat else {"index": 0, "text": w}
            await resp.write(b"data: " + orjson.dumps({"id": "x", "choices": [part]}) + b"\n\n")
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    text = "".join(words)
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    answer = {
        "id": "x",
        "object": "chat.completion" if chat else "text_completion",
        "model": MODEL,
        "choices": [{**choice, "finish_reason": "length"}],
        "usage": usage,
        **extra,
    }
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


def _vllm_prefill_problem(request: web.Request, body: dict[str, Any]) -> str | None:
    if body.get("stream") is not False:
        return "a prefill request must say stream: false"
    if body.get("max_tokens") != 1:
        return "a prefill request must ask max_tokens 1"
    if "max_completion_tokens" in body and body["max_completion_tokens"] != 1:
        return "a prefill request must ask max_completion_tokens 1"
    for name in ("stream_options", "min_tokens", "min_completion_tokens"):
        if name in body:
            return f"a prefill request takes no {name}"
    if not request.headers.get("X-Request-Id"):
        return "a prefill request needs an X-Request-Id"
    return None


async def _vllm(request: web.Request, e: Engine, body: dict[str, Any]) -> web.StreamResponse:
    kv = body.get("kv_transfer_params")
    rid = request.headers.get("X-Request-Id", "")
    if isinstance(kv, dict) and kv.get("do_remote_decode"):
        if e.role == "decode":
            return _refused("a decode engine does not prefill for others")
        problem = _vllm_prefill_problem(request, body)
        if problem is not None:
            return _refused(problem)
        blocks = [next(e._ids) for _ in range(3)]
        e.blocks[rid] = blocks
        answered = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": blocks,
            "remote_engine_id": e.engine_id,
            "remote_host": hostport.LOOPBACK,
            "remote_port": e.port,
            "tp_size": 1,
        }
        return await _answer(request, e, body, {"kv_transfer_params": answered})
    if isinstance(kv, dict) and kv.get("do_remote_prefill"):
        if e.role == "prefill":
            return _refused("a prefill engine does not decode for others")
        url = f"http://{hostport.join(kv['remote_host'], kv['remote_port'])}/kv/{rid}"
        query = {
            "engine": str(kv["remote_engine_id"]),
            "blocks": orjson.dumps(kv["remote_block_ids"]).decode(),
        }
        async with aiohttp.ClientSession() as http, http.get(url, params=query) as r:
            if r.status != 200:
                return _error(500, f"KV transfer from {url} failed: {r.status}")
    elif kv is not None:
        return _refused(f"kv_transfer_params not understood: {kv!r}")
    return await _answer(request, e, body, {"kv_transfer_params": None})


async def _sglang(request: web.Request, e: Engine, body: dict[str, Any]) -> web.StreamResponse:
    fields = [body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")]
    if e.role == "both":
        return await _answer(request, e, body, {})
    host, port, room = fields
    if not isinstance(host, str) or not isinstance(room, int) or not 0 <= room < 2**63:
        return _refused("a disaggregated server needs bootstrap_host and bootstrap_room")
    if port is not None and not isinstance(port, int):
        return _refused("bootstrap_port must be an integer or null")
    if e.role == "prefill":
        e.room(room).set()
        # A prefill server generates the first token only; the decode server the rest.
        return await _answer(request, e, {**body, "max_tokens": 1}, {})
    if port is None:
        return _error(500, "no bootstrap port to meet the prefill at")
    url = f"http://{host}:{port}/room/{room}"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        if r.status != 200:
            return _error(500, f"no prefill arrived in room {room}")
    return await _answer(request, e, body, {})


async def generate(request: web.Request) -> web.StreamResponse:
    e = request.app[ENGINE]
    raw = await request.read()
    body = orjson.loads(raw)
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS}
    e.received.append({"path": request.path, "headers": headers, "body": body})
    e.total += 1
    name = body.get("rid") or request.headers.get("X-Request-Id", "")
    task = asyncio.current_task()
    if isinstance(body.get("rid"), str) and task is not None:
        e.by_rid[body["rid"]] = task
    e.inflight += 1
    try:
        fault = e.faults.popleft() if e.faults else None
        if fault is not None and "token_seconds" in fault:
            request[DELAY] = float(fault["token_seconds"])
        elif fault is not None:
            if fault.get("hang"):
                await asyncio.sleep(3600)
            if fault.get("reset") and request.transport is not None:
                request.transport.abort()
                return web.Response(status=500)
            return _error(int(fault.get("status", 500)), "injected")
        if e.protocol == "sglang":
            return await _sglang(request, e, body)
        return await _vllm(request, e, body)
    except asyncio.CancelledError:
        e.cut.append(str(name))
        raise
    finally:
        e.inflight -= 1
        if isinstance(body.get("rid"), str):
            e.by_rid.pop(body["rid"], None)


async def abort_request(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    rid = (await request.json()).get("rid", "")
    e.aborted.append(rid)
    task = e.by_rid.pop(rid, None)
    if task is not None:
        task.cancel()
    return web.json_response({})


async def pull(request: web.Request) -> web.Response:
    """A decode engine pulls a request's blocks: only those handed out, under that id."""
    e = request.app[ENGINE]
    rid = request.match_info["rid"]
    blocks = orjson.loads(request.query.get("blocks", "null"))
    if request.query.get("engine") != e.engine_id or e.blocks.get(rid) != blocks:
        return web.Response(status=404)
    del e.blocks[rid]
    return web.Response()


async def room(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    try:
        async with asyncio.timeout(ROOM_WAIT_SECONDS):
            await e.room(int(request.match_info["room"])).wait()
    except TimeoutError:
        return web.Response(status=404)
    return web.Response()


async def fault(request: web.Request) -> web.Response:
    request.app[ENGINE].faults.append(await request.json())
    return web.json_response({})


async def received(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    doc = {"requests": list(e.received), "aborted": e.aborted, "cut": e.cut, "total": e.total}
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


async def reset(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    e.received.clear()
    e.aborted.clear()
    e.cut.clear()
    e.faults.clear()
    return web.json_response({})


async def metrics(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    name = "sglang:num_running_reqs" if e.protocol == "sglang" else "vllm:num_requests_running"
    return web.Response(text=f'{name}{{model_name="{MODEL}"}} {e.running + e.inflight}\n')


async def models(request: web.Request) -> web.Response:
    card = {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "pd"}
    return web.json_response({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    return web.Response()


def build_app(e: Engine) -> web.Application:
    app = web.Application()
    app[ENGINE] = e
    for path in GENERATION:
        app.router.add_post(path, generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_get("/kv/{rid}", pull)
    app.router.add_post("/fault", fault)
    app.router.add_get("/received", received)
    app.router.add_post("/reset", reset)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def bootstrap_app(e: Engine) -> web.Application:
    app = web.Application()
    app[ENGINE] = e
    app.router.add_get("/room/{room}", room)
    return app


@contextlib.asynccontextmanager
async def serving(e: Engine, host: str = hostport.LOOPBACK) -> AsyncIterator[str]:
    """Serve ``e`` (and its bootstrap server, for SGLang's prefill role) while the block runs."""
    runners = [web.AppRunner(build_app(e), handler_cancellation=True, access_log=None)]
    if e.protocol == "sglang" and e.role == "prefill":
        runners.append(web.AppRunner(bootstrap_app(e), access_log=None))
    try:
        for runner, port in zip(runners, (e.port, e.bootstrap_port), strict=False):
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
        e.port = runners[0].addresses[0][1]
        if len(runners) > 1:
            e.bootstrap_port = runners[1].addresses[0][1]
        yield f"http://{hostport.join(host, e.port)}"
    finally:
        for runner in runners:
            await runner.cleanup()


async def _main(args: argparse.Namespace) -> None:
    e = Engine(
        args.protocol, args.role, args.port, args.bootstrap_port, args.running, args.token_seconds
    )
    async with serving(e, args.host):
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--protocol", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--role", choices=("prefill", "decode", "both"), default="both")
    parser.add_argument("--host", default=hostport.LOOPBACK)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bootstrap-port", type=int, default=0)
    parser.add_argument("--running", type=int, default=0)
    parser.add_argument("--token-seconds", type=float, default=0.0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
