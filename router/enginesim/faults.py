"""Requests cut short on purpose: the faults ``POST /fault`` injects, and aborts.

Test hook, fault injection for the gateway's tests (unauthenticated unless ``--api-key``: never
expose engine-sim to untrusted clients). A fault applies to the next ``count`` (default 1)
generation requests (chat, completions, embeddings), taken when a request arrives, before its
body is read; setting a fault replaces the pending one. ``"every": K`` plays it on every K-th
request only (2: every other one fails), ``count`` times.

    POST /fault {"mode": "status", "status": 503, "count": N}
        answer ``status`` (400-599) in OpenAI's error shape, before any other byte
    POST /fault {"mode": "hang", "count": N}
        accept the request and send nothing until the client gives up (a 504 after
        HANG_LIMIT_SECONDS)
    POST /fault {"mode": "drop-mid-stream", "count": N}
        serve normally, then abort the connection after the first two tokens (a non-streamed
        answer is cut after half its body)
    POST /fault {"mode": "clear"}
        drop the pending fault

Aborts: ``abort_connection`` resets a request's connection without a proper end (a dropped
answer, and how a stopped request's connection is closed); ``POST /abort_request`` (SGLang's:
``{"rid": ...}`` or ``{"abort_all": true}``) stops the requests of a rid, and what it stops is
``router.enginesim.cancel``'s.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from router.enginesim.app_keys import DISAGG, ENGINE, RUNS
from router.enginesim.engine import Engine
from router.enginesim.requests import parse_abort, parse_fault
from router.gateway.openai.errors import GatewayError

# A hung request gives up by itself eventually, so a forgotten client cannot pin it forever.
HANG_LIMIT_SECONDS = 300.0
DROP_AFTER_TOKENS = 2


class InjectedFault(GatewayError):
    """The answer ``POST /fault`` asked for: any status from 400 to 599."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def abort_connection(request: web.Request) -> None:
    """Reset the connection without a proper end: what a crashed engine looks like to a proxy."""
    transport = request.transport
    if transport is not None:
        transport.abort()


async def play_fault(engine: Engine) -> bool:
    """Play the pending fault, if any; True when this request must drop mid-stream."""
    fault = engine.take_fault()
    if fault is None:
        return False
    if fault.mode == "status":
        raise InjectedFault(fault.status, f"injected fault: status {fault.status}")
    if fault.mode == "hang":
        await asyncio.sleep(HANG_LIMIT_SECONDS)
        raise InjectedFault(504, f"injected fault: hung for {HANG_LIMIT_SECONDS:g} s")
    return True


async def half_body(request: web.Request, body: bytes) -> web.StreamResponse:
    """A dropped JSON answer: promise the whole body, send half, vanish (a truncated payload)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.content_length = len(body)
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    abort_connection(request)
    return resp


async def fault(request: web.Request) -> web.Response:
    """POST /fault: arm or clear an injected fault (a test hook, see the module docstring)."""
    engine = request.app[ENGINE]
    engine.fault = parse_fault(await request.read())
    body = {"fault": engine.fault.described() if engine.fault else None}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def abort_request(request: web.Request) -> web.Response:
    """POST /abort_request: stop the requests of a rid, SGLang's way (router.enginesim.cancel)."""
    rid = parse_abort(await request.read())
    request.app[RUNS].abort(rid)
    request.app[DISAGG].abort(rid)
    return web.Response()
