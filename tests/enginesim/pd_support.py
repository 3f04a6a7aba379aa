"""Helpers for the disaggregation tests: engine-sim processes in a role, and the bodies the
peers' proxies send (vLLM's toy proxy, SGLang's mini load balancer)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import aiohttp

from router.core.disaggregation import DEFAULT_KV_BYTES_PER_TOKEN
from tests.support import Proc, start_kvrouter

BLOCK_TOKENS = 4
LINK_GBPS = 1.0
# Fast compute, so that the link's time is the one that shows.
SPEED = ["--prefill-tokens-per-s", "1e6", "--decode-tokens-per-s", "1000"]


def start_engine(tmp: Path, kind: str, role: str, *extra: str) -> Proc:
    """An engine-sim process of ``kind`` in ``role`` on a free loopback port."""
    args = [
        "engine-sim", "--kind", kind, "--role", role, "--block-tokens", str(BLOCK_TOKENS),
        "--link-gbps", str(LINK_GBPS), *SPEED, *extra,
    ]  # fmt: skip
    return start_kvrouter(args, tmp)


def transfer_seconds(tokens: int) -> float:
    """What moving ``tokens`` of KV takes over the test link: bytes x 8 / bits per second."""
    return tokens * DEFAULT_KV_BYTES_PER_TOKEN * 8 / (LINK_GBPS * 1e9)


def vllm_prefill_body(client: dict[str, Any]) -> dict[str, Any]:
    """The prefill request vLLM's toy proxy makes of a client's body."""
    body = copy.deepcopy(client)
    body["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in ("stream_options", "min_tokens", "min_completion_tokens"):
        body.pop(name, None)
    return body


def vllm_decode_body(client: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The decode request: the client's body with the prefill engine's kv_transfer_params."""
    body = copy.deepcopy(client)
    body["kv_transfer_params"] = answer["kv_transfer_params"]
    return body


def sglang_body(client: dict[str, Any], port: int | None, room: int) -> dict[str, Any]:
    """The body SGLang's mini load balancer sends to both engines."""
    return {**client, "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}


async def stats(http: aiohttp.ClientSession, proc: Proc) -> dict[str, Any]:
    async with http.get(f"{proc.url}/stats") as resp:
        assert resp.status == 200
        got: dict[str, Any] = await resp.json()
        return got


async def post(
    http: aiohttp.ClientSession, proc: Proc, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with http.post(f"{proc.url}/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)
