"""vLLM's transfer between engines: a prefill engine's held blocks and a decode engine's pull.

A prefill engine holds a finished prefill's blocks for the decode engine to read them
(``HeldKv``), as vLLM's NIXL connector delays freeing them: until the decode side says it has
read them, or ``RoleSettings.wait_seconds`` later (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
Engine-sim serves the read on its own HTTP port, ``POST /kv/pull``:

    {"remote_engine_id": ..., "remote_request_id": ..., "remote_block_ids": [...], "tokens": N}
    -> 200 {"engine_id": ..., "blocks": B, "tokens": N}

and releases the blocks. An engine id that is not this engine's is a 400 (vLLM's handshake
checks it: "Remote NIXL agent engine ID mismatch"); a request whose blocks are not held here
(pulled already, expired, or never prefilled here) is a 404. ``pull`` is the decode side: one
real loopback request, so that a dead prefill engine is a real failure.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from router import hostport
from router.enginesim.disagg_wire import RemoteKv
from router.gateway.openai.errors import BadRequest, NotFound
from router.gateway.openai.request import json_object

PULL_PATH = "/kv/pull"
# Prefills whose blocks wait at once, at most; the oldest is let go past this.
MAX_HELD = 4096
# vLLM's handshake gives a dead peer 5 s to answer.
CONNECT_SECONDS = 5.0
# Block ids stay small positive integers, as an engine's block table numbers them.
_BLOCK_ID_SPACE = 2**31


class TransferFailed(Exception):
    """The KV a request needs from, or must give to, the other engine cannot be moved (the
    request is answered 500, as both engines fail it: ``router.enginesim.disagg``)."""


@dataclass(slots=True)
class Held:
    """One prefill's blocks, waiting to be pulled."""

    block_ids: tuple[int, ...]
    tokens: int
    timer: asyncio.TimerHandle


class HeldKv:
    """Prefills' blocks held for decode engines, each until pulled or ``wait_seconds``."""

    def __init__(self, wait_seconds: float, expired: Callable[[], None]) -> None:
        self.wait_seconds = wait_seconds
        self._expired = expired
        self._held: dict[str, Held] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request_id: str, prompt_tokens: int, block_tokens: int) -> tuple[int, ...]:
        """Hold the blocks of a prompt of ``prompt_tokens`` (its last one partial); their ids."""
        count = max(1, math.ceil(prompt_tokens / block_tokens))
        ids = tuple(next(self._ids) % _BLOCK_ID_SPACE for _ in range(count))
        self.release(request_id)
        while len(self._held) >= MAX_HELD:
            self._expire(next(iter(self._held)))
        timer = asyncio.get_running_loop().call_later(self.wait_seconds, self._expire, request_id)
        self._held[request_id] = Held(ids, prompt_tokens, timer)
        return ids

    def take(self, request_id: str) -> Held | None:
        """The blocks held for ``request_id``, now released (None: none are held)."""
        held = self._held.pop(request_id, None)
        if held is not None:
            held.timer.cancel()
        return held

    def release(self, request_id: str) -> None:
        self.take(request_id)

    def close(self) -> None:
        for held in self._held.values():
            held.timer.cancel()
        self._held.clear()

    def _expire(self, request_id: str) -> None:
        if self.take(request_id) is not None:
            self._expired()


def answer_detail(status: int, answer: bytes) -> str:
    """What an engine's error answer says: its message, else the start of its body."""
    try:
        message = orjson.loads(answer)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = answer[:200].decode("utf-8", "replace")
    return f"{status} {message}"


def _pull_fields(raw: bytes) -> tuple[str, str, int]:
    body = json_object(raw)
    engine, request_id, tokens = (
        body.get("remote_engine_id"),
        body.get("remote_request_id"),
        body.get("tokens"),
    )
    if not isinstance(engine, str) or not isinstance(request_id, str) or not request_id:
        raise BadRequest("give 'remote_engine_id' and 'remote_request_id' as strings")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise BadRequest("'tokens' must be a non-negative integer", "tokens")
    return engine, request_id, tokens


def serve_pull(raw: bytes, engine_id: str, held: HeldKv) -> dict[str, Any]:
    """A ``POST /kv/pull`` body -> its answer; the blocks are released."""
    engine, request_id, tokens = _pull_fields(raw)
    if engine != engine_id:
        raise BadRequest(
            f"engine id mismatch: this engine is {engine_id}, not {engine}", "remote_engine_id"
        )
    blocks = held.take(request_id)
    if blocks is None:
        raise NotFound(f"no KV is held for request {request_id!r} (pulled, expired or unknown)")
    return {"engine_id": engine_id, "blocks": len(blocks.block_ids), "tokens": tokens}


async def pull(
    session: aiohttp.ClientSession,
    remote: RemoteKv,
    tokens: int,
    wait_seconds: float,
    headers: dict[str, str],
) -> None:
    """Read ``tokens`` of a prompt's KV from the prefill engine ``remote`` names, releasing its
    blocks there; raises ``TransferFailed`` when it cannot be read."""
    where = hostport.join(remote.host, remote.port)
    body = {
        "remote_engine_id": remote.engine_id,
        "remote_request_id": remote.request_id,
        "remote_block_ids": list(remote.block_ids),
        "tokens": tokens,
    }
    timeout = aiohttp.ClientTimeout(total=wait_seconds, connect=CONNECT_SECONDS)
    try:
        async with session.post(
            f"http://{where}{PULL_PATH}", data=orjson.dumps(body), headers=headers, timeout=timeout
        ) as resp:
            answer = await resp.read()
            if resp.status != 200:
                detail = answer_detail(resp.status, answer)
                raise TransferFailed(f"KV transfer from {where} failed: {detail}")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransferFailed(
            f"KV transfer from {where} failed: {exc or type(exc).__name__}"
        ) from exc
