"""Traces from a real ``kvrouter serve`` process into a collector in the test process.

The collector (tests.otlp) decodes what arrives over OTLP/gRPC; engine-sim's ``/stats`` lists
the ``traceparent`` each generation request carried, so a test checks both ends: the spans
and their parent links, and the context the engine was handed on every attempt.
"""

from __future__ import annotations

import os
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.integration import MODEL
from tests.otlp import Collector, Received
from tests.support import Proc, eventually, http_json, running, start_kvrouter

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
# The environment without whatever OTEL_* variables the test runner has.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
# Export each batch at once instead of every 5 s (the SDK's default), so waits stay short.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


def _config(tmp_path: Path, tracing: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "health: {interval_seconds: 0.5}\n"
        "timeouts: {first_byte_seconds: 5}\n"
        "limits: {max_attempts: 2, retry_backoff_seconds: 0}\n"
        f"tracing: {tracing}\n"
    )
    return path


def _start(
    tmp_path: Path, procs: list[Proc], engines: int, tracing: str, env: dict[str, str]
) -> Proc:
    for _ in range(engines):
        procs.append(start_kvrouter(["engine-sim", "--fast"], tmp_path, base_env=BASE_ENV))
    args = ["serve", "--config", str(_config(tmp_path, tracing)), "--log-level", "warning"]
    for e in procs:
        args += ["--engine", e.url]
    router = start_kvrouter(args, tmp_path, ready_path="/ready", env=env, base_env=BASE_ENV)
    procs.append(router)
    return router


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as c:
        yield c


def chat(router: Proc, text: str, headers: dict[str, str] | None = None) -> object:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return http_json(f"{router.url}{CHAT}", body, headers)


def traceparents(engine: Proc) -> list[str]:
    return list(http_json(f"{engine.url}/stats")["traceparents"])


def by_name(spans: list[Received]) -> dict[str, list[Received]]:
    out: dict[str, list[Received]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


async def test_tracing_request_span_continues_the_client_and_the_engine_sees_its_attempt(
    tmp_path: Path, collector: Collector
) -> None:
    tracing = f"{{enabled: true, endpoint: '{collector.endpoint}', service_name: router-a}}"
    with running([]) as procs:
        router = _start(tmp_path, procs, 1, tracing, FAST_EXPORT)
        engine = procs[0]
        headers = {"traceparent": CLIENT_PARENT, "tracestate": "vendor=opaque"}
        chat(router, "hello traced world", headers)

        def whole() -> dict[str, list[Received]]:
            got = by_name(collector.spans(CLIENT_TRACE))
            return got if {"admission", "decision", "attempt", f"POST {CHAT}"} <= set(got) else {}

        spans = await eventually(whole, timeout=30)
        (server,) = spans[f"POST {CHAT}"]
        assert server.parent_id == CLIENT_SPAN
        assert server.service == "router-a"
        assert server.kind == 2  # SPAN_KIND_SERVER
        assert server.attributes["http.response.status_code"] == 200
        for step in ("admission", "decision", "attempt"):
            assert [s.parent_id for s in spans[step]] == [server.span_id]
        (decision,) = spans["decision"]
        assert decision.attributes["kvrouter.decision.engine"] == engine.url
        assert decision.attributes["kvrouter.decision.candidates"] == 1
        assert decision.attributes["kvrouter.decision.top_engines"] == [engine.url]
        assert len(decision.attributes["kvrouter.decision.top_scores"]) == 1
        (attempt,) = spans["attempt"]
        assert attempt.attributes["kvrouter.engine"] == engine.url
        assert attempt.attributes["kvrouter.attempt"] == 1
        assert attempt.attributes["http.response.status_code"] == 200
        assert attempt.events == ("first_byte",)
        # The engine's parent is the router's attempt span, in the client's trace; the
        # client's own traceparent did not reach it.
        assert traceparents(engine) == [f"00-{CLIENT_TRACE}-{attempt.span_id}-01"]


async def test_tracing_every_attempt_sends_its_own_span_to_its_engine(
    tmp_path: Path, collector: Collector
) -> None:
    tracing = f"{{enabled: true, endpoint: '{collector.endpoint}'}}"
    with running([]) as procs:
        router = _start(tmp_path, procs, 2, tracing, FAST_EXPORT)
        engines = procs[:2]
        # Each engine fails its next request: both attempts fail, and the client gets a 502.
        for e in engines:
            http_json(f"{e.url}/fault", {"mode": "status", "status": 503})
        with pytest.raises(urllib.error.HTTPError) as failed:
            chat(router, "fails everywhere", {"traceparent": CLIENT_PARENT})
        failed.value.close()
        assert failed.value.code == 502

        async def attempts() -> list[Received]:
            got = by_name(collector.spans(CLIENT_TRACE))
            return got.get("attempt", []) if f"POST {CHAT}" in got else []

        tried = sorted(
            await eventually(attempts, timeout=30), key=lambda s: s.attributes["kvrouter.attempt"]
        )
        assert [s.attributes["kvrouter.attempt"] for s in tried] == [1, 2]
        assert {s.attributes["kvrouter.engine"] for s in tried} == {e.url for e in engines}
        assert all(s.attributes["http.response.status_code"] == 503 for s in tried)
        assert all(s.status_code == 2 for s in tried)  # STATUS_CODE_ERROR
        (server,) = by_name(collector.spans(CLIENT_TRACE))[f"POST {CHAT}"]
        assert server.attributes["http.response.status_code"] == 502
        for s in tried:
            engine = next(e for e in engines if e.url == s.attributes["kvrouter.engine"])
            assert traceparents(engine) == [f"00-{CLIENT_TRACE}-{s.span_id}-01"]


async def test_tracing_unsampled_request_still_passes_its_context_unflagged(
    tmp_path: Path, collector: Collector
) -> None:
    # New traces are dropped; a client's sampled trace is followed (parent based).
    env = {**FAST_EXPORT, "OTEL_TRACES_SAMPLER": "parentbased_always_off"}
    tracing = f"{{enabled: true, endpoint: '{collector.endpoint}'}}"
    with running([]) as procs:
        router = _start(tmp_path, procs, 1, tracing, env)
        engine = procs[0]
        chat(router, "nobody asked for a trace")
        (dropped,) = traceparents(engine)
        version, trace_id, _span, flags = dropped.split("-")
        assert version == "00"
        assert int(flags, 16) & 1 == 0  # not sampled (0x02 may say the trace id is random)
        assert trace_id != CLIENT_TRACE
        chat(router, "the client asked", {"traceparent": CLIENT_PARENT})
        await eventually(lambda: collector.spans(CLIENT_TRACE), timeout=30)
        # Exported in order: had the dropped request made spans, they would be here by now.
        assert collector.spans(trace_id) == []


def test_tracing_off_passes_the_client_context_to_the_engine_untouched(tmp_path: Path) -> None:
    with running([]) as procs:
        router = _start(tmp_path, procs, 1, "{enabled: false}", {})
        engine = procs[0]
        chat(router, "no tracing here", {"traceparent": CLIENT_PARENT, "tracestate": "a=b"})
        chat(router, "and no context either")
        assert traceparents(engine) == [CLIENT_PARENT]
