"""The two wire protocols of a split request, as pure functions of bodies (no I/O).

vLLM's connectors (NIXL, P2P) split a request in two, one after the other, as vLLM's own
disaggregation proxy sends them: the client's body to the prefill engine with
``kv_transfer_params`` asking for a remote decode (``REMOTE_DECODE``), ``stream`` false,
``max_tokens`` 1 (``max_completion_tokens`` 1 too, when the client sent it), and neither
``stream_options`` nor ``min_tokens`` / ``min_completion_tokens`` (a prefill engine refuses
them); the prefill engine answers with a top-level ``kv_transfer_params`` naming where its
blocks wait; the decode engine gets the client's body with exactly that object as its
``kv_transfer_params`` (none at all when the prefill engine answered none, so a client never
steers a decode engine to pull blocks from an address of its choosing).

SGLang's disaggregation sends one body to both engines at once: the client's, with
``bootstrap_host`` (the prefill engine's host), ``bootstrap_port`` (its bootstrap server's
port, null when unknown) and ``bootstrap_room`` (a random 63-bit integer naming the pair's
rendezvous) set, as SGLang's own load balancer sets them.

Fields keep the client's order; a field the protocol adds goes last, one it sets keeps its
place (a dict's copy-and-assign, which is what both proxies do). ``strip_json`` and
``strip_event`` take the protocols' fields (``PRIVATE``) out of an engine's answer before a
client sees it: vLLM's decode engine answers ``"kv_transfer_params": null``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

# The routes both peers' proxies split; every other route runs whole.
SPLIT_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
KV_PARAMS = "kv_transfer_params"
# A prefill request's kv_transfer_params: prefill here, decode elsewhere (vLLM's connectors).
REMOTE_DECODE: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Fields vLLM's prefill engines refuse (they generate one token, nothing more).
NOT_FOR_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")
BOOTSTRAP = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
# The protocols' own fields: never in what a client gets.
PRIVATE = frozenset({KV_PARAMS, *BOOTSTRAP})
# bootstrap_room is drawn from [0, ROOMS): SGLang's rooms are non-negative 64-bit signed ints.
ROOMS = 2**63
_PRIVATE_KEY = re.compile(rb'"(?:kv_transfer_params|bootstrap_(?:host|port|room))"')
_LINE = re.compile(rb"(\r\n|\r|\n)")


def vllm_prefill(client: Mapping[str, Any]) -> dict[str, Any]:
    """The body vLLM's prefill engine gets for the client's ``client`` body."""
    body = dict(client)
    body[KV_PARAMS] = dict(REMOTE_DECODE)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in NOT_FOR_PREFILL:
        body.pop(name, None)
    return body


def vllm_decode(client: Mapping[str, Any], answered: Mapping[str, Any] | None) -> dict[str, Any]:
    """The body vLLM's decode engine gets: the client's, with the ``kv_transfer_params`` the
    prefill engine ``answered`` (None: with none)."""
    body = dict(client)
    if answered:
        body[KV_PARAMS] = dict(answered)
    else:
        body.pop(KV_PARAMS, None)
    return body


def transfer_params(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` object of a prefill engine's JSON answer (None: none)."""
    try:
        value = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    params = value.get(KV_PARAMS) if isinstance(value, dict) else None
    return params if isinstance(params, dict) and params else None


def sglang(client: Mapping[str, Any], host: str, port: int | None, room: int) -> dict[str, Any]:
    """The body both SGLang engines of a pair get."""
    body = dict(client)
    body.update(bootstrap_host=host, bootstrap_port=port, bootstrap_room=room)
    return body


def bootstrap_host(engine: str) -> str:
    """The host of the prefill engine at base URL ``engine``, as its decode peer dials it (an
    IPv6 literal in brackets)."""
    host = urlsplit(engine).hostname or ""
    return f"[{host}]" if ":" in host else host


def new_room() -> int:
    """A fresh ``bootstrap_room``: random, so concurrent pairs never meet in one room."""
    return secrets.randbelow(ROOMS)


def strip_json(body: bytes) -> bytes:
    """``body`` without the top-level ``PRIVATE`` fields of the JSON object it holds (the same
    bytes when it holds none, or is no JSON object)."""
    if _PRIVATE_KEY.search(body) is None:
        return body
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(value, dict) or PRIVATE.isdisjoint(value):
        return body
    return orjson.dumps({k: v for k, v in value.items() if k not in PRIVATE})


def strip_event(event: bytes) -> bytes:
    """An event-stream piece of whole events with ``strip_json`` applied to each ``data:``
    line (comments, other fields and line endings kept)."""
    if _PRIVATE_KEY.search(event) is None:
        return event
    parts = _LINE.split(event)  # line, ending, line, ending, ..., rest
    for i in range(0, len(parts), 2):
        line = parts[i]
        if line.startswith(b"data:"):
            lead = 6 if line.startswith(b"data: ") else 5
            parts[i] = line[:lead] + strip_json(line[lead:])
    return b"".join(parts)
