"""The decode engine's answer as the client gets it (router.gateway.disagg.answers): the
protocols' fields gone whatever the chunk boundaries, everything else as it came."""

from __future__ import annotations

import orjson
import pytest

from router.gateway.disagg import answers
from router.gateway.disagg.answers import Stripped, StrippingUpstream
from router.gateway.openai import sse
from router.gateway.upstream.client import UpstreamRequest
from tests.fakes import JSON, SSE, FakeEngine, FakeResponse, FakeUpstream, Script

A = "http://decode-0:8000"
EVENTS = b"".join(
    [
        sse.encode(
            orjson.dumps({"choices": [{"delta": {"content": "hi"}}], "kv_transfer_params": None})
        ),
        sse.encode(orjson.dumps({"choices": [{"delta": {"content": " there"}}]})),
        sse.encode(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3}})),
        sse.DONE,
    ]
)
CLEAN = b"".join(
    [
        sse.encode(orjson.dumps({"choices": [{"delta": {"content": "hi"}}]})),
        sse.encode(orjson.dumps({"choices": [{"delta": {"content": " there"}}]})),
        sse.encode(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3}})),
        sse.DONE,
    ]
)
WHOLE = orjson.dumps({"id": "c", "choices": [], "kv_transfer_params": None, "usage": {}})


async def drain(resp: Stripped) -> list[bytes]:
    out = []
    for _ in range(10_000):
        chunk = await resp.read_chunk()
        if not chunk:
            break
        out.append(chunk)
    assert resp.finished()
    return out


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 7, 31, 64, len(EVENTS)])
async def test_a_stream_loses_the_fields_whatever_its_chunks(size: int) -> None:
    resp = Stripped(FakeResponse(A, Script(headers=dict(SSE), chunks=pieces(EVENTS, size))))
    out = await drain(resp)
    assert b"".join(out) == CLEAN
    assert all(c.endswith(b"\n\n") for c in out)  # whole events: the relay sees their ends


@pytest.mark.parametrize("size", [1, 5, len(WHOLE)])
async def test_a_whole_answer_loses_them_and_its_length(size: int) -> None:
    headers = {**JSON, "Content-Length": str(len(WHOLE))}
    resp = Stripped(FakeResponse(A, Script(headers=headers, chunks=pieces(WHOLE, size))))
    assert "Content-Length" not in resp.headers
    assert b"".join(await drain(resp)) == b'{"id":"c","choices":[],"usage":{}}'


async def test_an_error_answer_passes_untouched() -> None:
    body = b'{"error": {"message": "no", "kv_transfer_params": null}}'
    resp = Stripped(FakeResponse(A, Script(status=503, chunks=pieces(body, 4))))
    assert b"".join(await drain(resp)) == body


async def test_an_answer_too_large_to_hold_passes_as_it_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(answers, "STRIP_BYTES", 8)
    resp = Stripped(FakeResponse(A, Script(chunks=pieces(WHOLE, 4))))
    assert b"".join(await drain(resp)) == WHOLE
    partial = b'data: {"kv_transfer_params": null, "x": "' + b"y" * 20
    stream = Stripped(FakeResponse(A, Script(headers=dict(SSE), chunks=pieces(partial, 4))))
    assert b"".join(await drain(stream)) == partial


async def test_the_upstream_says_when_an_answer_has_bytes() -> None:
    engine = FakeEngine(A)
    up = StrippingUpstream(FakeUpstream(engine))
    resp = await up.send(UpstreamRequest(A, "/v1/chat/completions", (), b'{"model": "m"}'))
    before = up.answered
    assert await resp.read_chunk()
    assert (before, up.answered) == (False, True)
    resp.release()
