"""Prefill/decode disaggregation in front of engine-sim's own roles (``engine-sim --role``):
``kvrouter serve`` with a prefill and a decode engine-sim under each protocol, every request
split (``decider: always``), called with the official openai client, streamed and not.

engine-sim keeps the two sides to their protocol for real (router.enginesim.disagg): a vLLM
decode engine pulls the tokens named by the ``kv_transfer_params`` the prefill engine
answered, an SGLang decode engine meets its prefill engine in the bootstrap room; each counts
what it did in ``/stats``. A client leaving mid-stream stops the SGLang decode engine by an
abort of its rid.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from tests.gateway.integration import MODEL
from tests.gateway.integration.test_gateway import assert_inflight_zero
from tests.support import (
    LOOPBACK,
    Proc,
    eventually,
    http_json,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

CONFIG = """
engines:
  static:
    - {{url: "{prefill}", role: prefill, kind: {kind}{port}}}
    - {{url: "{decode}", role: decode, kind: {kind}}}
disaggregation: {{protocol: {kind}, decider: always}}
timeouts: {{first_byte_seconds: 30}}
"""
# Quick prefills, a few tokens a second of decode: a client can leave mid-stream.
SPEED = ("--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", "20")
PRIVATE = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room")


@dataclass
class Fleet:
    kind: str
    prefill: Proc
    decode: Proc
    router: Proc

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    kind: str = request.param
    tmp = tmp_path_factory.mktemp(f"pd-sim-{kind}")
    with running([]) as procs:
        sims = {}
        for role in ("prefill", "decode"):
            args = ["engine-sim", "--kind", kind, "--role", role, "--model", MODEL, *SPEED]
            sims[role] = start_kvrouter(args, tmp)
            procs.append(sims[role])
        port = stats(sims["prefill"]).get("bootstrap_port")
        config = tmp / "serve.yaml"
        config.write_text(
            CONFIG.format(
                prefill=sims["prefill"].url,
                decode=sims["decode"].url,
                kind=kind,
                port=f", bootstrap_port: {port}" if port else "",
            )
        )
        router = start_kvrouter(["serve", "--config", str(config), "--host", LOOPBACK], tmp)
        procs.append(router)
        wait_until(lambda: readiness(router)["healthy_backends"] == 2, "both engines healthy")
        yield Fleet(kind, sims["prefill"], sims["decode"], router)
        log = router.log()
        assert router.stop() == 0
        assert "Traceback" not in log


def stats(engine: Proc) -> dict[str, Any]:
    got: dict[str, Any] = http_json(f"{engine.url}/stats")
    return got


def prompt(tag: str) -> str:
    return f"{tag}: " + " ".join(f"clause {i} of the {tag} contract." for i in range(30))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_split_across_engine_sims(fleet: Fleet, stream: bool) -> None:
    before_p, before_d = stats(fleet.prefill), stats(fleet.decode)
    messages: Any = [{"role": "user", "content": prompt(f"chat-{fleet.kind}-{stream}")}]
    client = fleet.client()
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=5, stream=True
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(not set(PRIVATE) & set(c.model_extra or {}) for c in chunks)
    else:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        text = answer.choices[0].message.content or ""
        assert not set(PRIVATE) & set(answer.model_extra or {})
    assert text
    after_p, after_d = stats(fleet.prefill), stats(fleet.decode)
    assert after_p["prefilled_for_remote"] == before_p["prefilled_for_remote"] + 1
    assert after_d["transferred_tokens"] > before_d["transferred_tokens"]
    assert after_d["requests"] == before_d["requests"] + 1
    assert_inflight_zero(fleet.router)


def test_completions_split_across_engine_sims(fleet: Fleet) -> None:
    before = stats(fleet.decode)["transferred_tokens"]
    answer = fleet.client().completions.create(
        model=MODEL, prompt=prompt(f"completion-{fleet.kind}"), max_tokens=3
    )
    assert answer.choices[0].text
    assert stats(fleet.decode)["transferred_tokens"] > before
    assert_inflight_zero(fleet.router)


async def test_a_client_leaving_mid_stream_stops_the_decode(fleet: Fleet) -> None:
    before = stats(fleet.decode)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(f"leaving-{fleet.kind}")}],
        "max_tokens": 200,
        "stream": True,
    }
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{fleet.router.url}/v1/chat/completions", json=body)
        assert resp.status == 200
        assert await resp.content.readany()
        resp.close()

    def idle() -> dict[str, Any]:
        s = stats(fleet.decode)
        assert s["running"] == s["waiting"] == 0, s
        return s

    after = await eventually(idle, timeout=15)
    # It stopped long before its 200 tokens (20 a second): the client's leaving reached it.
    assert after["completion_tokens"] + after["tokens_after_disconnect"] < (
        before["completion_tokens"] + before["tokens_after_disconnect"] + 100
    )
    if fleet.kind == "sglang":
        assert after["aborted"] == before["aborted"] + 1
    assert_inflight_zero(fleet.router)
