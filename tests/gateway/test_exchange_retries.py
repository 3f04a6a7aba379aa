"""The exchange's retries over ``FakeUpstream``: what is retried on the next engine, what is
the engine's verdict, whose fault a failure is, and the retry budget."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from router.core.retry_budget import BudgetRules
from router.gateway.config.serving import Forwarding, Limits
from tests.fakes import JSON, FakeEngine, Script, error_answer
from tests.gateway.rig import CHAT, A, B, C, chat, rig


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
async def test_exchange_failure_before_first_byte_retried_elsewhere(
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


async def test_exchange_4xx_passed_through_not_retried(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(error_answer(400, "temperature must be at most 2"))
        status, body = await r.post(CHAT, chat())
        assert status == 400
        assert body["error"]["message"] == "temperature must be at most 2"
        assert len(r.up.sent) == 1
        assert await r.metric("kvrouter_retries_total") == 0


TRACEBACK_400 = {
    "object": "error",
    "message": "Request failed: Traceback (most recent call last):\n  File "
    '"/usr/lib/python3.12/site-packages/vllm/serving_chat.py", line 3\nValueError',
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


async def test_exchange_engine_4xx_reaches_the_client_without_its_insides(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        leaky = {"Set-Cookie": "engine=1", "X-Internal-Node": "gpu-7", "Retry-After": "2"}
        r.up.next(
            Script(status=429, headers={**JSON, **leaky}, chunks=[orjson.dumps(TRACEBACK_400)])
        )
        async with r.client.post(CHAT, json=chat()) as resp:
            body = await resp.json()
            assert resp.status == 429 and resp.headers["Retry-After"] == "2"
            assert "Set-Cookie" not in resp.headers and "X-Internal-Node" not in resp.headers
        assert body["error"]["message"] == "Request failed"
        assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == "400"
        assert "Traceback" not in orjson.dumps(body).decode()


async def test_exchange_engine_4xx_on_messages_in_anthropics_shape(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.up.next(error_answer(400, "max_tokens: must be at most 4096"))
        messages = {
            "model": "m",
            "max_tokens": 9999,
            "messages": [{"role": "user", "content": "x"}],
        }
        status, body = await r.post("/v1/messages", messages)
        assert status == 400 and body["type"] == "error"
        assert body["error"]["message"] == "max_tokens: must be at most 4096"


async def test_exchange_engine_4xx_verbatim_for_a_trusted_fleet(tmp_path: Path) -> None:
    trusted = Forwarding(engine_error_bodies="verbatim")
    async with rig(tmp_path, forwarding=trusted) as r:
        r.up.next(Script(status=400, chunks=[orjson.dumps(TRACEBACK_400)]))
        status, body = await r.post(CHAT, chat())
        assert status == 400 and body == TRACEBACK_400


@pytest.mark.parametrize(
    ("status", "ctype", "body"),
    [
        (404, "text/html", b"<html>nginx: /srv/models/secret not found</html>"),
        (401, "application/json", b'"Unauthorized"'),  # JSON, but no error object
        (413, "text/plain", b""),
    ],
)
async def test_exchange_non_json_engine_4xx_wrapped_in_openai_shape_body_only_logged(
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


async def test_exchange_engine_5xx_body_stays_in_the_log_client_gets_request_id(
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


async def test_exchange_request_id_made_when_missing_or_unsafe(tmp_path: Path) -> None:
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
async def test_exchange_every_attempt_fails_openai_error(
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


async def test_exchange_consecutive_failures_eject_backend_passively(tmp_path: Path) -> None:
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
        # isolated_share 0: any failing engine is a brown-out, so every retry needs the budget.
        r.gw.services.retry_budget.rules = BudgetRules(ratio=0.0, min_retries=0, isolated_share=0)
        r.up.next(error_answer(503))
        status, body = await r.post(CHAT, chat())
        assert status == 503 and body["error"]["code"] == "no_backend_available"
        assert len(r.up.sent) == 1
        assert await r.metric("kvrouter_retries_refused_total") == 1
        assert r.gw.services.retry_budget.retries == 0


async def test_retry_away_from_one_failing_engine_needs_no_budget(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.gw.services.retry_budget.rules = BudgetRules(ratio=0.0, min_retries=0)
        r.up.next(error_answer(503))
        status, _ = await r.post(CHAT, chat())
        assert status == 200 and len(r.up.sent) == 2
        assert await r.metric("kvrouter_retries_total") == 1
        assert await r.metric("kvrouter_retries_refused_total") == 0
        assert r.gw.services.retry_budget.retries == 0  # nothing was spent, nothing owed
