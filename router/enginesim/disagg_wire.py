"""Prefill/decode disaggregation as an engine reads it off a request, and what it answers.

vLLM (its NIXL connector) carries one object, ``kv_transfer_params``. A request whose object
says ``do_remote_decode: true`` is prefilled here for a decode engine elsewhere: it runs to its
``max_tokens`` (1, as the proxies send it), its blocks are held for pulling, and the answer
carries a top-level ``kv_transfer_params`` saying where they wait (``remote_prefill_params``,
the fields of the connector's ``request_finished``). A request whose object says
``do_remote_prefill: true`` and names the blocks, their engine, host and port pulls the tokens
it lacks from there instead of prefilling them; one that says so without naming them all is
run whole, as the connector does with a warning ("will not utilize KVTransfer").

SGLang (its PD servers) reads ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room``:
the prefill server at that host and bootstrap port, and the room both sides of one request
meet in. Wrong types are refused as both engines' request models refuse them (400).

``RoleSettings`` are one engine's role, link and patience. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from router.core.disaggregation import DisaggSettings, Role
from router.gateway.openai.errors import BadRequest
from router.hostport import LOOPBACK

# What a decode engine does when the KV it should pull cannot be had: vLLM's
# ``kv_load_failure_policy`` ("fail", its default: the request fails; "recompute": it prefills
# the missing tokens itself).
LoadFailure = Literal["fail", "recompute"]
LOAD_FAILURES: tuple[LoadFailure, ...] = ("fail", "recompute")
# How long one side waits for the other: SGLang's bootstrap and waiting timeouts default to
# 300 s; vLLM holds unpulled blocks for VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s).
DEFAULT_WAIT_SECONDS = 300.0
# SGLang's rooms are 63-bit integers.
MAX_ROOM = 2**63 - 1
# The fields a vLLM decode request must name to pull (``remote_request_id`` is newer: optional).
_REMOTE_FIELDS = ("remote_block_ids", "remote_engine_id", "remote_host", "remote_port")


@dataclass(frozen=True, slots=True)
class RoleSettings:
    """One engine's part in a disaggregated fleet."""

    role: Role = "both"
    # The link a transfer crosses (its bandwidth) and what one token's KV weighs.
    link: DisaggSettings = field(default_factory=DisaggSettings)
    # Where an SGLang prefill engine's bootstrap server listens (port 0: a free port).
    host: str = LOOPBACK
    bootstrap_port: int = 0
    # How long held blocks wait to be pulled, and one side of a room for the other.
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    load_failure: LoadFailure = "fail"

    def __post_init__(self) -> None:
        if self.wait_seconds <= 0:
            raise ValueError("the transfer timeout must be positive")
        if not 0 <= self.bootstrap_port <= 65535:
            raise ValueError("the bootstrap port must be from 0 to 65535")


@dataclass(frozen=True, slots=True)
class RemoteKv:
    """Where a vLLM decode request's prompt KV waits: the prefill engine's answer."""

    engine_id: str
    request_id: str | None
    block_ids: tuple[int, ...]
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """SGLang's rendezvous fields, as the request gave them (None: absent)."""

    host: str | None
    port: int | None
    room: int | None


@dataclass(frozen=True, slots=True)
class PdFields:
    """What a request says of disaggregation (all defaults: nothing)."""

    remote_decode: bool = False  # vLLM: prefill here, decode elsewhere
    remote_prefill: RemoteKv | None = None  # vLLM: pull the prompt's KV from there
    bootstrap: Bootstrap | None = None  # SGLang: the fields, when any is given


NONE = PdFields()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _remote(params: Mapping[str, Any]) -> RemoteKv | None:
    """The pull a ``do_remote_prefill`` object names, or None when it names too little."""
    if any(params.get(name) is None for name in _REMOTE_FIELDS):
        return None
    blocks, engine, host, port = (params[name] for name in _REMOTE_FIELDS)
    request_id = params.get("remote_request_id")
    if not (isinstance(blocks, list) and blocks and all(_is_int(b) for b in blocks)):
        return None
    if not (isinstance(engine, str) and isinstance(host, str) and host and _is_int(port)):
        return None
    if not 0 < port <= 65535 or not (request_id is None or isinstance(request_id, str)):
        return None
    return RemoteKv(engine, request_id, tuple(blocks), host, port)


def _bootstrap(body: Mapping[str, Any]) -> Bootstrap | None:
    host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
    if host is None and port is None and room is None:
        return None
    if host is not None and not isinstance(host, str):
        raise BadRequest("'bootstrap_host' must be a string", "bootstrap_host")
    if port is not None and not (_is_int(port) and 0 < port <= 65535):
        raise BadRequest("'bootstrap_port' must be an integer from 1 to 65535", "bootstrap_port")
    if room is not None and not (_is_int(room) and 0 <= room <= MAX_ROOM):
        raise BadRequest(
            f"'bootstrap_room' must be an integer from 0 to {MAX_ROOM}", "bootstrap_room"
        )
    return Bootstrap(host, port, room)


def parse_pd(body: Mapping[str, Any]) -> PdFields:
    """A request body's disaggregation fields; raises ``BadRequest`` on wrong types."""
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("'kv_transfer_params' must be an object", "kv_transfer_params")
    bootstrap = _bootstrap(body)
    if not params and bootstrap is None:
        return NONE
    params = params or {}
    remote = _remote(params) if params.get("do_remote_prefill") is True else None
    return PdFields(params.get("do_remote_decode") is True, remote, bootstrap)


def remote_prefill_params(
    block_ids: tuple[int, ...], engine_id: str, request_id: str, host: str, port: int
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill engine answers: where its blocks wait."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(block_ids),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }
