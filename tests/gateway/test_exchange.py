"""The gateway in-process over ``FakeUpstream``: relay, retries, timeouts, disconnects, load.

Every test ends by checking that the load the router took is all given back (its local
counters and the ``kvrouter_backend_inflight_*`` gauges are zero) and that every upstream
response was released or aborted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from router.core.retry_budget import BudgetRules
from router.gateway import exchange as exchange_module
from router.gateway.app import Gateway, build_app
from router.gateway.config.settings import (
    Config,
    DnsEngines,
    EngineSources,
    Forwarding,
    HealthSettings,
    Limits,
    Timeouts,
)
from router.gateway.openai import sse
from router.gateway.upstream import relay as answer_module
from router.gateway.upstream.deadline import Deadline
from tests.fakes import (
    SSE,
    FakeEngine,
    FakeUpstream,
    Script,
    error_answer,
    openai_answer,
)

A, B, C = "http://engine-a:8000", "http://engine-b:8000", "http://engine-c:8000"
CHAT = "/v1/chat/completions"
TOKEN = "s3cret-token"

POLICY = """
version: 1
name: test-kv
block_chars: 16
filters:
  - type: bounded-load
    epsilon: 0.5
scorers:
  - type: prefix-overlap
    weight: 2
  - type: load
    weight: 1
"""


def chat(text: str = "hello there, how are you today?", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def config(*urls: str, **changes: Any) -> Config:
    cfg = Config(
        engines=EngineSources(static=urls),
        # Probes run once at start; tests drive health themselves.
        health=HealthSettings(interval_seconds=3600, eject_after_failures=3),
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=0.3, idle_stream_seconds=0.3),
        limits=Limits(max_body_bytes=4096, max_attempts=3),
    )
    return dataclasses.replace(cfg, **changes)


@dataclasses.dataclass
class Rig:
    client: TestClient[Any, Any]
    gw: Gateway
    up: FakeUpstream

    async def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.client.post(path, data=data, **kw) as r:
            raw = await r.read()
            return r.status, orjson.loads(raw) if raw[:1] in (b"{", b"[") else raw

    async def metric(self, name: str, **labels: str) -> float:
        return metric_value(await (await self.client.get("/metrics")).text(), name, **labels)


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def assert_all_released(rig: Rig) -> None:
    """Load, leases and claims back to zero, and every upstream response closed one way or
    another."""
    core = rig.gw.core
    for _ in range(200):  # a cancelled handler finishes its cleanup on the next loop turns
        if not core.loads.local_all() and not core.outstanding and not rig.up.unfinished():
            break
        await asyncio.sleep(0.005)
    assert core.loads.local_all() == {}
    assert core.outstanding == 0 and not core.predictions
    assert rig.up.unfinished() == []
    text = await (await rig.client.get("/metrics")).text()
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("kvrouter_backend_inflight"):
            assert all(s.value == 0 for s in fam.samples), fam


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *engines: FakeEngine,
    env: dict[str, str] | None = None,
    ready: bool = True,
    policy_text: str = POLICY,
    **changes: Any,
) -> AsyncIterator[Rig]:
    engines = engines or (FakeEngine(A), FakeEngine(B))
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    up = FakeUpstream(*engines)
    gw = Gateway(
        config(*(e.url for e in engines), **changes), policy, upstream=up, environ=env or {}
    )
    client = TestClient(TestServer(build_app(gw)))
    await client.start_server()
    r = Rig(client, gw, up)
    try:
        if ready:
            for _ in range(200):
                if (await client.get("/ready")).status == 200:
                    break
                await asyncio.sleep(0.01)
        yield r
        await assert_all_released(r)
    finally:
        await client.close()
    assert up.closed


# -- relaying ----------------------------------------------------------------------------


async def test_proxy_nonstream_sends_original_bytes_relays_answer(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        raw = b'{ "messages" : [{"content":"hi there","role":"user"}],\n "model":"m" , "x": 1.50}'
        status, body = await r.post(CHAT, raw)
        assert status == 200 and body["object"] == "chat.completion"
        sent = [q for e in r.up.engines.values() for q in e.requests]
        assert [q.body for q in sent] == [raw]
        assert sent[0].path == CHAT


@pytest.mark.parametrize("trusted", [False, True], ids=["default", "forwarding-configured"])
async def test_proxy_headers_hop_by_hop_dropped_client_auth_per_config_xff_appended(
    tmp_path: Path, trusted: bool
) -> None:
    forwarding = Forwarding(client_credentials=trusted, trust_forwarding_headers=trusted)
    async with rig(tmp_path, forwarding=forwarding) as r:
        headers = {
            "Authorization": "Bearer client-key",
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic x",
            "TE": "trailers",
            "X-Forwarded-For": "203.0.113.7",
            "X-Request-Id": "abc",
            "Accept-Encoding": "gzip",
        }
        status, _ = await r.post(CHAT, chat(), headers=headers)
        assert status == 200
        (q,) = [q for e in r.up.engines.values() for q in e.requests]
        sent = {k.lower(): v for k, v in q.headers}
        if trusted:
            assert sent["authorization"] == "Bearer client-key"
            assert sent["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
        else:
            assert "authorization" not in sent  # the client's key for the gateway stays here
            assert sent["x-forwarded-for"] == "127.0.0.1"  # what the client wrote is not believed
        assert sent["x-request-id"] == "abc"
        assert sent["accept-encoding"] == "identity"
        for hop in ("connection", "x-secret-hop", "keep-alive", "proxy-authorization", "te"):
            assert hop not in sent
        assert "host" not in sent and "content-length" not in sent


async def test_proxy_stream_relayed_byte_for_byte_usage_counted(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        body = chat(stream=True, stream_options={"include_usage": True})
        expected = b"".join(openai_answer(body, cached=0).chunks)
        async with r.client.post(CHAT, json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            got = await resp.read()
        assert got == expected
        assert await r.metric("kvrouter_ttft_seconds_count") == 1
        assert await r.metric("kvrouter_prompt_tokens_total") == 10


async def test_proxy_usage_cached_tokens_counted_nonstream(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, cached=8)) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
        assert await r.metric("kvrouter_cached_tokens_total") == 8
        assert await r.metric("kvrouter_prompt_tokens_total") == 10


async def test_proxy_repeated_prefix_same_backend_overlap_recorded(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A), FakeEngine(B), FakeEngine(C)) as r:
        system = "You are a helpful assistant that answers in French. " * 4
        for i in range(4):
            body = {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
            }
            assert (await r.post(CHAT, body))[0] == 200
        assert len(set(r.up.sent)) == 1
        assert await r.metric("kvrouter_prefix_overlap_ratio_sum") > 0
        assert await r.metric("kvrouter_index_blocks") > 0


# -- retries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (error_answer(503), "503"),
        (Script(connect_error=True), "error"),
        (Script(hang=True), "timeout"),
        (Script(chunks=[b'{"partial": '], drop_after=1), "error"),
        (Script(chunks=[b'{"slow": '], hang_after=1), "timeout"),
    ],
    ids=["status-503", "connect-error", "first-byte-timeout", "dropped-body", "idle-body"],
)
async def test_proxy_failure_before_first_byte_retried_elsewhere(
    tmp_path: Path, failure: Script, code: str
) -> None:
    async with rig(tmp_path) as r:
        r.up.next(failure)
        status, body = await r.post(CHAT, chat())
        assert status == 200, body
        first, second = r.up.sent
        assert first != second
        assert await r.metric("kvrouter_retries_total") == 1
        assert await r.metric("kvrouter_backend_requests_total", backend=first, code=code) == 1
        assert await r.metric("kvrouter_backend_requests_total", backend=second, code="200") == 1
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="200") == 1


async def test_proxy_4xx_passed_through_not_retried(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(error_answer(400, "temperature must be at most 2"))
        status, body = await r.post(CHAT, chat())
        assert status == 400
        assert body["error"]["message"] == "temperature must be at most 2"
        assert len(r.up.sent) == 1
        assert await r.metric("kvrouter_retries_total") == 0


@pytest.mark.parametrize(
    ("status", "ctype", "body"),
    [
        (404, "text/html", b"<html>nginx: /srv/models/secret not found</html>"),
        (401, "application/json", b'"Unauthorized"'),  # JSON, but no error object
        (413, "text/plain", b""),
    ],
)
async def test_proxy_non_json_engine_4xx_wrapped_in_openai_shape_body_only_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int, ctype: str, body: bytes
) -> None:
    async with rig(tmp_path) as r:
        r.up.next(Script(status=status, headers={"Content-Type": ctype}, chunks=[body]))
        async with r.client.post(CHAT, json=chat(), headers={"X-Request-Id": "req-7"}) as resp:
            got = await resp.json()  # JSON whatever the engine sent
            assert resp.status == status and resp.content_type == "application/json"
        assert got["error"]["code"] == "upstream_refused"
        assert set(got["error"]) == {"message", "type", "param", "code"}
        assert "secret" not in got["error"]["message"] and "127.0.0.1" not in str(got)
        assert len(r.up.sent) == 1  # a refusal is not retried
        assert any("req-7" in m and str(status) in m for m in caplog.messages)


async def test_proxy_engine_5xx_body_stays_in_the_log_client_gets_request_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with rig(tmp_path) as r:
        internal = "<html>proxy 10.1.2.3 /srv/models/secret failed</html>"
        r.up.next(error_answer(503, "busy a"), error_answer(502, internal))
        async with r.client.post(CHAT, json=chat(), headers={"X-Request-Id": "req-42"}) as resp:
            body = await resp.json()
            assert resp.status == 502 and resp.headers["X-Request-Id"] == "req-42"
        assert set(body["error"]) == {"message", "type", "param", "code"}
        message = body["error"]["message"]
        assert "req-42" in message and "10.1.2.3" not in message and "engine-" not in message
        assert len(r.up.sent) == 2  # two candidates: nothing left to try
        assert any("req-42" in m and "/srv/models/secret" in m for m in caplog.messages)
        sent_ids = [dict(q.headers).get("X-Request-Id") for q in r.up.engines[A].requests]
        sent_ids += [dict(q.headers).get("X-Request-Id") for q in r.up.engines[B].requests]
        assert sent_ids == ["req-42", "req-42"]  # both attempts carried it


async def test_proxy_request_id_made_when_missing_or_unsafe(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for given in (None, "has spaces and \u00e9", "x" * 65):
            headers = {} if given is None else {"X-Request-Id": given}
            async with r.client.post(CHAT, json=chat(), headers=headers) as resp:
                rid = resp.headers["X-Request-Id"]
                assert resp.status == 200 and rid != given and len(rid) == 16


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (Script(connect_error=True), 502, "upstream_unreachable"),
        (Script(hang=True), 504, "upstream_timeout"),
    ],
)
async def test_proxy_every_attempt_fails_openai_error(
    tmp_path: Path, failure: Script, status: int, code: str
) -> None:
    engines = (FakeEngine(A), FakeEngine(B), FakeEngine(C))
    async with rig(tmp_path, *engines, limits=Limits(max_attempts=2)) as r:
        r.up.next(failure, failure, failure)
        got, body = await r.post(CHAT, chat())
        assert got == status
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == code
        assert len(r.up.sent) == 2  # bounded by max_attempts, not by the three candidates
        r.up.upcoming.clear()


async def test_proxy_consecutive_failures_eject_backend_passively(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.engines[A].down = True
        for i in range(12):
            assert (await r.post(CHAT, chat(f"{i * 7919:05d} a distinct prompt " * 3)))[0] == 200
        # Three failed attempts eject A; after that it is no candidate and never tried again.
        assert r.up.sent.count(A) == 3
        assert r.gw.pool.engines[A].health.state.value == "ejected"
        assert await r.metric("kvrouter_backend_healthy", backend=A) == 0
        assert await r.metric("kvrouter_backend_healthy", backend=B) == 1
        assert await r.metric("kvrouter_retries_total") == 3


async def test_request_failing_on_two_engines_is_its_fault_nobody_ejected(tmp_path: Path) -> None:
    # Requests that make every engine answer 5xx (a poisoned body) must not take the fleet
    # down: two failures of one request are the request's fault, never retried further.
    engines = (FakeEngine(A), FakeEngine(B), FakeEngine(C))
    async with rig(tmp_path, *engines) as r:
        for i in range(8):
            r.up.sent.clear()
            r.up.next(error_answer(500), error_answer(500))
            status, body = await r.post(CHAT, chat(f"poison {i}"))
            assert status >= 500 and set(body["error"]) == {"message", "type", "param", "code"}
            assert len(r.up.sent) == 2  # stopped after the second engine failed too
        assert all(e.healthy for e in r.gw.pool.engines.values())
        assert (await r.post(CHAT, chat("an innocent request")))[0] == 200


async def test_engine_failing_for_everyone_ejected_by_distinct_requests(tmp_path: Path) -> None:
    engines = (FakeEngine(A, failing=500), FakeEngine(B), FakeEngine(C))
    async with rig(tmp_path, *engines) as r:
        for i in range(40):
            assert (await r.post(CHAT, chat(f"{i * 7919:05d} a distinct prompt " * 3)))[0] == 200
        # Each failure on A was blamed on A once B or C answered: three eject it.
        assert r.up.sent.count(A) == 3
        assert r.gw.pool.engines[A].health.state.value == "ejected"
        assert r.gw.pool.engines[B].healthy and r.gw.pool.engines[C].healthy


async def test_request_shaped_failures_never_eject_past_half_the_fleet(tmp_path: Path) -> None:
    engines = (FakeEngine(A, failing=500), FakeEngine(B, failing=500))
    async with rig(tmp_path, *engines, limits=Limits(max_attempts=1)) as r:
        for i in range(10):
            assert (await r.post(CHAT, chat(f"{i} prompt")))[0] >= 500
        healthy = [e for e in r.gw.pool.engines.values() if e.healthy]
        assert len(healthy) == 1  # one ejected (50%), the last one kept


async def test_retry_budget_spent_answers_503_without_retrying(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.gw.services.retry_budget.rules = BudgetRules(ratio=0.0, min_retries=0)
        r.up.next(error_answer(503))
        status, body = await r.post(CHAT, chat())
        assert status == 503 and body["error"]["code"] == "no_backend_available"
        assert len(r.up.sent) == 1
        assert await r.metric("kvrouter_retries_refused_total") == 1
        assert r.gw.services.retry_budget.retries == 0


# -- streams that fail after they started --------------------------------------------------


def stream_script(**kw: Any) -> Script:
    body = chat(stream=True)
    return dataclasses.replace(openai_answer(body), **kw)


async def read_events(resp: aiohttp.ClientResponse) -> list[sse.Event]:
    dec = sse.Decoder()
    events: list[sse.Event] = []
    async for chunk in resp.content.iter_any():
        events.extend(dec.feed(chunk))
    return events


@pytest.mark.parametrize(
    ("script", "code", "status_label"),
    [
        (stream_script(drop_after=2), "upstream_dropped", "502"),
        (stream_script(hang_after=1), "upstream_timeout", "504"),
    ],
    ids=["dropped", "idle-timeout"],
)
async def test_proxy_mid_stream_failure_ends_with_error_event(
    tmp_path: Path, script: Script, code: str, status_label: str
) -> None:
    async with rig(tmp_path) as r:
        r.up.next(script)
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            events = await read_events(resp)
        assert events, "the stream must have started"
        last = json.loads(events[-1].data)
        assert last["error"]["code"] == code
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert not any(e.done for e in events)
        assert len(r.up.sent) == 1  # not retried: the client had bytes
        assert await r.metric("kvrouter_requests_total", route=CHAT, code=status_label) == 1


async def test_proxy_client_disconnect_mid_stream_aborts_engine_request(tmp_path: Path) -> None:
    async with rig(
        tmp_path,
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=5, idle_stream_seconds=30),
    ) as r:
        r.up.next(stream_script(hang_after=1))
        resp = await r.client.post(CHAT, json=chat(stream=True))
        assert resp.status == 200
        await resp.content.readany()
        assert r.gw.core.loads.local_all() != {}
        resp.close()  # the client goes away mid-stream
        for _ in range(200):
            if r.up.responses[0].aborted:
                break
            await asyncio.sleep(0.01)
        assert r.up.responses[0].aborted
        await assert_all_released(r)
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="499") == 1


async def test_proxy_client_disconnect_before_first_byte_releases_load(tmp_path: Path) -> None:
    async with rig(
        tmp_path,
        timeouts=Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30),
    ) as r:
        r.up.next(Script(hang=True))
        with pytest.raises(asyncio.TimeoutError):
            await r.client.post(CHAT, json=chat(), timeout=aiohttp.ClientTimeout(total=0.2))
        await assert_all_released(r)
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="499") == 1


# -- refusals ----------------------------------------------------------------------------


async def test_proxy_body_over_limit_413(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, chat("x" * 5000))
        assert status == 413 and body["error"]["code"] == "request_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        async with r.client.post(CHAT, data=chunks()) as resp:
            assert resp.status == 413
        assert r.up.sent == []


async def test_proxy_unknown_model_404_openai_shape(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, {**chat(), "model": "gpt-nope"})
        assert status == 404
        assert body["error"]["param"] == "model" and body["error"]["code"] == "model_not_found"
        assert body["error"]["type"] == "invalid_request_error"


async def test_proxy_bad_json_400_says_what(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, body = await r.post(CHAT, b'{"model": "m", "messages": [}')
        assert status == 400 and "not valid JSON" in body["error"]["message"]
        status, body = await r.post(
            CHAT, {"model": "m", "messages": [{"role": "user"}], "stream": 1}
        )
        assert status == 400 and body["error"]["param"] == "stream"


async def test_proxy_no_healthy_backend_503_retry_after(tmp_path: Path) -> None:
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


# -- probes, models, metrics ---------------------------------------------------------------


async def test_ready_503_until_backend_healthy(tmp_path: Path) -> None:
    engine = FakeEngine(A, down=True)
    async with rig(tmp_path, engine, ready=False) as r:
        async with r.client.get("/ready") as resp:
            assert resp.status == 503
            assert (await resp.json())["reason"] == "no healthy engine yet"
        assert (await r.client.get("/health")).status == 200
        engine.down = False
        await r.gw.pool.probe_all()
        async with r.client.get("/ready") as resp:
            assert resp.status == 200
            assert (await resp.json())["policy"] == "test-kv"


async def test_models_union_of_healthy_backends(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, ["m", "x"]), FakeEngine(B, ["m", "y"])) as r:
        async with r.client.get("/v1/models") as resp:
            body = await resp.json()
        assert body["object"] == "list"
        assert [c["id"] for c in body["data"]] == ["m", "x", "y"]


EXPECTED_METRICS = {
    "kvrouter_requests",
    "kvrouter_request_duration_seconds",
    "kvrouter_ttft_seconds",
    "kvrouter_routing_decision_seconds",
    "kvrouter_prefix_overlap_ratio",
    "kvrouter_backend_inflight_requests",
    "kvrouter_backend_inflight_tokens",
    "kvrouter_backend_healthy",
    "kvrouter_backend_requests",
    "kvrouter_cached_tokens",
    "kvrouter_prompt_tokens",
    "kvrouter_index_blocks",
    "kvrouter_policy_reloads",
    "kvrouter_retries",
    "kvrouter_gossip_peers",
}


async def test_metrics_every_contract_name_exported(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await r.post(CHAT, chat())
        async with r.client.get("/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
        names = {fam.name for fam in text_string_to_metric_families(text)}
        assert names >= EXPECTED_METRICS
        assert metric_value(text, "kvrouter_policy_reloads_total", result="error") == 0
        assert metric_value(text, "kvrouter_gossip_peers") == 0
        assert metric_value(text, "kvrouter_requests_total", route=CHAT, code="200") == 1


async def test_metrics_registry_owned_by_each_app(tmp_path: Path) -> None:
    async with rig(tmp_path) as r1:
        (tmp_path / "b").mkdir()
        async with rig(tmp_path / "b") as r2:
            await r1.post(CHAT, chat())
            assert await r1.metric("kvrouter_requests_total") == 1
            assert await r2.metric("kvrouter_requests_total") == 0


# -- admin ---------------------------------------------------------------------------------


async def test_admin_off_without_token_404(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, _ = await r.post("/debug/route", chat(), headers={"Authorization": "Bearer x"})
        assert status == 404


@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]
)
async def test_admin_wrong_or_missing_token_401(tmp_path: Path, auth: str | None) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        headers = {"Authorization": auth} if auth else {}
        status, body = await r.post("/debug/route", chat(), headers=headers)
        assert status == 401 and body["error"]["type"] == "authentication_error"


async def test_admin_debug_route_explains_without_load_or_blocks(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, body = await r.post("/debug/route", chat("a long prompt " * 10), headers=auth)
        assert status == 200, body
        assert body["policy"] == "test-kv" and body["engine"] in (A, B)
        assert {c["engine"] for c in body["candidates"]} == {A, B}
        assert body["blocks"] > 0
        assert len(r.gw.core.index) == 0 and r.gw.core.loads.local_all() == {}
        assert r.up.sent == []
        async with r.client.get("/debug/backends", headers=auth) as resp:
            backends = (await resp.json())["backends"]
        assert {b["url"] for b in backends} == {A, B}
        assert all(b["state"] == "healthy" for b in backends)


async def test_admin_debug_route_bad_body_400(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, _ = await r.post("/debug/route", b"[]", headers=auth)
        assert status == 400


async def test_admin_token_env_name_from_config(tmp_path: Path) -> None:
    env = {"MY_TOKEN": TOKEN}
    async with rig(tmp_path, env=env, admin_token_env="MY_TOKEN") as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await r.post("/debug/route", chat(), headers=auth))[0] == 200


async def test_sse_headers_from_engine_relayed(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(stream_script(headers={**SSE, "X-Engine": "a", "Connection": "close"}))
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.headers["X-Engine"] == "a"
            assert resp.headers.get("Connection", "").lower() != "close"
            await resp.read()


# -- fuzzing the whole handler: no input gets a 500 ----------------------------------------


@pytest.fixture(scope="module")
def fuzz_rig(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, Rig]]:
    """One gateway on its own loop for every fuzz example (hypothesis drives a sync test)."""
    loop = asyncio.new_event_loop()
    tmp = tmp_path_factory.mktemp("fuzz")
    cm = rig(tmp, FakeEngine(A), FakeEngine(B, ["m", "n"]))
    r = loop.run_until_complete(cm.__aenter__())
    try:
        yield loop, r
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
field_names = st.sampled_from(
    ["model", "messages", "prompt", "input", "stream", "stream_options", "role", "content",
     "type", "text", "image_url", "url", "tools", "tool_calls", "name", "user", "lora_path"]
)  # fmt: skip
shaped = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(field_names, inner, max_size=5),
    max_leaves=30,
)
request_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "n", "zzz", "", 3])},
    optional={"messages": shaped, "prompt": shaped, "input": shaped, "stream": shaped},
).map(lambda b: json.dumps(b).encode()) | st.binary(max_size=64)
routes = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=request_bodies, route=routes)
def test_fuzz_handler_never_500(
    fuzz_rig: tuple[asyncio.AbstractEventLoop, Rig], body: bytes, route: str
) -> None:
    loop, r = fuzz_rig

    async def one() -> tuple[int, bytes]:
        async with r.client.post(route, data=body) as resp:
            return resp.status, await resp.read()

    status, raw = loop.run_until_complete(one())
    assert status < 500, raw
    if status >= 400:
        assert set(orjson.loads(raw)["error"]) == {"message", "type", "param", "code"}
    assert r.gw.core.loads.local_all() == {}


async def test_dns_backends_resolved_probed_and_routed(tmp_path: Path) -> None:
    dns = DnsEngines("localhost", 9, interval_seconds=3600)
    engine = FakeEngine("http://127.0.0.1:9")
    async with rig(tmp_path, engine, engines=EngineSources(dns=dns)) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
        assert r.up.sent == ["http://127.0.0.1:9"]
        assert r.gw.pool.engines["http://127.0.0.1:9"].source == "dns"


SESSION_POLICY = """
name: sessions
block_chars: 16
cold_prefix: score  # with ring, a prefix nobody holds goes to its ring home whatever the session
scorers:
  - type: session-affinity
    weight: 10
    header: X-Session-Id
  - type: load
    weight: 1
"""


@pytest.mark.parametrize("how", ["header", "user-field"], ids=["session-header", "body-user-field"])
async def test_session_affinity_keeps_a_session_on_one_backend(tmp_path: Path, how: str) -> None:
    engines = (FakeEngine(A), FakeEngine(B), FakeEngine(C))
    async with rig(tmp_path, *engines, policy_text=SESSION_POLICY) as r:
        for i in range(6):
            body = chat(f"{i:03d} unrelated prompt {i}")
            headers = {}
            if how == "header":
                headers["X-Session-Id"] = "conversation-42"
            else:
                body["user"] = "conversation-42"
            assert (await r.post(CHAT, body, headers=headers))[0] == 200
        assert len(set(r.up.sent)) == 1


async def test_proxy_body_trickling_past_deadline_408(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exchange_module, "BODY_READ_SECONDS", 0.1)
    async with rig(tmp_path) as r:

        async def trickle() -> AsyncIterator[bytes]:
            yield b'{"model": "m", '
            await asyncio.sleep(0.5)
            yield b'"messages": [{"role": "user", "content": "x"}]}'

        async with r.client.post(CHAT, data=trickle()) as resp:
            assert resp.status == 408
            assert (await resp.json())["error"]["code"] == "request_timeout"
        assert r.up.sent == []


# -- relay mechanics: one send for head and first event, one timer per stream, coalescing ------


async def test_event_stream_head_and_first_event_leave_in_one_write() -> None:
    # Pins the aiohttp attribute EventStream relies on (_send_headers_immediately): if a new
    # aiohttp sends the head at prepare() again, this fails.
    writes: list[bytes] = []
    transport = mock.Mock(is_closing=lambda: False)
    transport.write.side_effect = lambda d: writes.append(bytes(d))
    transport.writelines.side_effect = lambda ds: writes.append(b"".join(ds))
    protocol = mock.Mock(transport=transport, _paused=False)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request(
        "POST", CHAT, writer=writer, protocol=protocol, transport=transport
    )
    out = answer_module.EventStream(headers=SSE)
    await out.prepare(request)
    assert writes == []
    await out.write(b"data: 1\n\n")
    (sent,) = writes
    assert sent.startswith(b"HTTP/1.1 200 OK\r\n") and sent.endswith(b"data: 1\n\n\r\n")
    await out.write_eof()
    assert writes[1:] == [b"0\r\n\r\n"]


async def wait_on(deadline: Deadline, seconds: float, pause: float) -> str:
    """One guarded wait of ``pause`` seconds: "ok", "expired" or "cancelled"."""
    deadline.start(seconds)
    try:
        await asyncio.sleep(pause)
        return "ok"
    except asyncio.CancelledError:
        return "expired" if deadline.expired() else "cancelled"
    finally:
        deadline.stop()


async def test_deadline_short_waits_never_expire_however_long_the_stream() -> None:
    async def stream() -> list[str]:
        deadline = Deadline(0.1)
        try:
            # 25 waits of 10 ms against a 100 ms limit: 250 ms in all, each well inside.
            return [await wait_on(deadline, 0.1, 0.01) for _ in range(25)]
        finally:
            deadline.close()

    assert await asyncio.wait_for(stream(), 10) == ["ok"] * 25


@pytest.mark.parametrize("shortest", [0.05, 30], ids=["told-the-shortest", "told-nothing-shorter"])
async def test_deadline_shorter_wait_after_longer_expires_on_its_own_limit(
    shortest: float,
) -> None:
    async def attempt() -> list[str]:
        deadline = Deadline(shortest)
        try:
            first = await wait_on(deadline, 30, 0)  # a first byte allowed 30 s, there at once
            idle = await wait_on(deadline, 0.05, 30)  # then an idle limit of 50 ms
            return [first, idle]
        finally:
            deadline.close()

    # Well before the first wait's 30 s: the timer was brought forward for the second.
    assert await asyncio.wait_for(attempt(), 10) == ["ok", "expired"]


async def test_deadline_other_cancellation_is_not_a_timeout() -> None:
    results: list[str] = []
    waiting = asyncio.Event()

    async def attempt() -> None:
        deadline = Deadline(30)
        try:
            deadline.start(30)
            waiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                results.append("expired" if deadline.expired() else "cancelled")
                raise
            finally:
                deadline.stop()
        finally:
            deadline.close()

    task = asyncio.create_task(attempt())
    await waiting.wait()
    task.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await task
    assert results == ["cancelled"]


@dataclasses.dataclass
class StreamingEngine:
    """An engine on loopback that streams ``first`` in one write, then ``rest`` when told."""

    first: list[bytes]
    rest: list[bytes]
    release: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    url: str = ""

    @staticmethod
    def frame(events: list[bytes]) -> bytes:
        return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                elif head.startswith(b"GET"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + self.frame(self.first)
                    )
                    await self.release.wait()
                    writer.write(self.frame(self.rest) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_proxy_real_upstream_events_that_come_together_relayed_at_once_in_order(
    tmp_path: Path,
) -> None:
    events = [
        sse.encode(orjson.dumps({"choices": [{"delta": {"content": f"t{i}"}}]})) for i in range(6)
    ]
    engine = StreamingEngine(events[:3], [*events[3:], sse.DONE])
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    timeouts = Timeouts(connect_seconds=2, first_byte_seconds=5, idle_stream_seconds=5)
    gw = Gateway(config(engine.url, timeouts=timeouts), policy, environ={})
    client = TestClient(TestServer(build_app(gw)))
    await client.start_server()
    try:
        for _ in range(200):
            if (await client.get("/ready")).status == 200:
                break
            await asyncio.sleep(0.01)
        async with client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            got = b""
            # The first three events reach the client while the engine holds back the rest:
            # what has arrived is relayed, never held for more.
            for _ in range(100):
                if len(got) >= len(b"".join(events[:3])):
                    break
                got += await asyncio.wait_for(resp.content.readany(), 5)
            assert got == b"".join(events[:3])
            engine.release.set()
            got += await resp.read()
        assert got == b"".join([*events, sse.DONE])
        decoded = sse.Decoder().feed(got)
        assert [e.data for e in decoded[:-1]] == [e[6:-2].decode() for e in events]
        assert decoded[-1].done
        assert (
            metric_value(
                await (await client.get("/metrics")).text(), "kvrouter_requests_total", code="200"
            )
            == 1
        )
    finally:
        await client.close()
        server.close()


EVENT = sse.encode(b'{"choices": [{"delta": {"content": "data: [DONE]"}}]}')


@pytest.mark.parametrize(
    ("chunk", "at_event", "ends"),
    [
        (sse.DONE, True, True),
        (EVENT + sse.DONE, False, True),
        (sse.DONE, False, False),  # the chunk before ended mid-event: this is not an event
        (EVENT, True, False),
        (b'data: {"a": 1}\ndata: [DONE]\n\n', True, False),  # a two-line event's data
        (b"xdata: [DONE]\n\n", True, False),
        (b"data: [DONE]\r\n\r\n", True, False),  # other line ends: the engine's end decides
    ],
    ids=["alone", "after-event", "alone-mid-event", "in-content", "second-data-line",
         "mid-line", "crlf"],
)  # fmt: skip
def test_ends_stream_only_a_whole_done_event(chunk: bytes, at_event: bool, ends: bool) -> None:
    assert answer_module.ends_stream(chunk, at_event) is ends


@pytest.mark.parametrize(
    "after",
    [{"chunks": [b"data: late\n\n"]}, {"drop_after": 2}],
    ids=["bytes-after-done", "dropped-after-done"],
)
async def test_proxy_stream_ends_at_done_engine_rest_not_relayed(
    tmp_path: Path, after: dict[str, Any]
) -> None:
    async with rig(tmp_path) as r:
        chunks = [EVENT, sse.DONE, *after.get("chunks", [])]
        r.up.next(Script(headers=dict(SSE), chunks=chunks, drop_after=after.get("drop_after")))
        async with r.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200
            got = await resp.read()
        assert got == EVENT + sse.DONE  # whole, and nothing after [DONE], no error event
        assert r.up.responses[0].aborted  # the engine's connection is not reused
        assert await r.metric("kvrouter_requests_total", route=CHAT, code="200") == 1
        assert await r.metric("kvrouter_backend_healthy", backend=r.up.sent[0]) == 1
