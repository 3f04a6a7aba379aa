"""The gateway in process over ``FakeUpstream`` with prefill and decode engines: what the
split path's in-process tests share (tests/gateway/rig.py's rig, with roles)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from router.core.disaggregation import DisaggSettings, Role, WireProtocol
from router.gateway.config.engines import EngineSources
from router.gateway.upstream.client import UpstreamRequest
from tests.fakes import FakeEngine
from tests.gateway.rig import Rig
from tests.support import eventually

P, P2 = "http://prefill-0:8000", "http://prefill-1:8000"
D, D2 = "http://decode-0:8000", "http://decode-1:8000"
BOOTSTRAP_PORT = 8998
# The engines' own report: sequences decode on them, so a local prefill would stall them and
# a split pays (router.core.disaggregation).
BUSY = (200, b'vllm:num_requests_running{model_name="m"} 4\nsglang:num_running_reqs 4\n')
# Long enough that the decode engine lacks more than stay_below_tokens.
PROMPT = " ".join(f"paragraph {i} of a long document about the harvest." for i in range(12))


def engines(*urls: str) -> list[FakeEngine]:
    """Fake engines for ``urls``, the decode ones busy."""
    return [FakeEngine(u, metrics=BUSY if "decode" in u else (404, b"")) for u in urls]


def pd(
    protocol: WireProtocol,
    urls: Sequence[str],
    *,
    sglang_kind: bool = False,
    bootstrap_port: int | None = BOOTSTRAP_PORT,
    **settings: Any,
) -> dict[str, Any]:
    """The rig's config changes for ``urls``: roles from their names, ``bootstrap_port`` for
    the prefill ones (None: unknown), SGLang's kind when asked (so attempts carry a rid and
    get aborts)."""
    roles: dict[str, Role] = {
        u: ("prefill" if "prefill" in u else "decode") for u in urls if "both" not in u
    }
    ports = {u: bootstrap_port for u in urls if "prefill" in u and bootstrap_port is not None}
    kinds = {u: "sglang" for u in urls} if sglang_kind else {}
    sources = EngineSources(
        static=tuple(urls), static_roles=roles, static_bootstrap_ports=ports, static_kinds=kinds
    )
    rules = DisaggSettings(protocol=protocol, stay_below_tokens=16, **settings)
    return {"engines": sources, "disaggregation": rules}


def chat(text: str = PROMPT, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


async def busy(r: Rig, *urls: str) -> None:
    """Wait until the gateway has scraped the decode engines' reports."""

    def reported() -> bool:
        now = r.gw.clock()
        return all(r.gw.core.loads.engine_reported(u, now) is not None for u in urls)

    await eventually(reported, timeout=5.0, interval=0.02)


def body_of(request: UpstreamRequest) -> dict[str, Any]:
    value: dict[str, Any] = orjson.loads(request.body)
    return value


def header(request: UpstreamRequest, name: str) -> str | None:
    for k, v in request.headers:
        if k.lower() == name.lower():
            return v
    return None


def prefill_answer(params: dict[str, Any] | None = None) -> bytes:
    """A vLLM prefill engine's answer: one token, and where its blocks wait."""
    kv = params or {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [7, 8, 9],
        "remote_engine_id": "engine-p0",
        "remote_host": "10.0.0.7",
        "remote_port": 5600,
        "tp_size": 1,
    }
    return orjson.dumps(
        {"id": "p", "object": "chat.completion", "choices": [], "kv_transfer_params": kv}
    )
