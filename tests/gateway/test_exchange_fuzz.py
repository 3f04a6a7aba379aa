"""Fuzzing the whole handler: no request body, on any generation route, gets a 500, and every
refusal comes in its route's API shape (Anthropic's on the Messages routes, OpenAI's elsewhere)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.gateway.openai.request import PROMPT_FIELD
from tests.fakes import FakeEngine
from tests.gateway.rig import A, B, Rig, rig


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
     "type", "text", "image_url", "url", "tools", "tool_calls", "name", "user", "lora_path",
     "system", "instructions", "id", "input_schema", "tool_use_id", "call_id", "arguments",
     "output", "source", "previous_response_id"]
)  # fmt: skip


shaped = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(field_names, inner, max_size=5),
    max_leaves=30,
)


request_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "n", "zzz", "", 3])},
    optional={
        "messages": shaped,
        "prompt": shaped,
        "input": shaped,
        "stream": shaped,
        "system": shaped,
        "instructions": shaped,
        "tools": shaped,
        "previous_response_id": shaped,
    },
).map(lambda b: json.dumps(b).encode()) | st.binary(max_size=64)


routes = st.sampled_from(sorted(PROMPT_FIELD))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    if status >= 400 and route.startswith("/v1/messages"):
        error = orjson.loads(raw)
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    elif status >= 400:
        assert set(orjson.loads(raw)["error"]) == {"message", "type", "param", "code"}
    assert r.gw.core.loads.local_all() == {}
