"""The Responses and Messages front doors: real ``kvrouter serve`` and ``engine-sim`` processes.

The official clients talk to the gateway as their users would: ``openai``'s
``responses.create`` (streamed and not) and ``anthropic``'s ``messages.create``,
``messages.stream`` and ``messages.count_tokens``. The gateway's totals must equal the usage the
clients saw, stateful Responses requests must land on the engine holding their response, and
every refusal must come in its API's own shape, mid-stream ones included.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from router.gateway.openai import sse
from tests.gateway.integration import MODEL
from tests.gateway.integration.test_gateway import Fleet, assert_inflight_zero, start_fleet
from tests.support import Proc, http_json, metric, readiness, running, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
# Several of the policy's 512-character blocks, in engine-sim's words.
SYSTEM = " ".join(f"rule{i} answer like a careful agent" for i in range(60))
MESSAGE: list[Any] = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("front-doors")
    with running([]) as procs:
        f = start_fleet(tmp, procs)
        yield f
        for e in f.engines:
            f.fault(e, mode="clear")
        assert f.router.stop() == 0
        assert "Traceback" not in f.router.log()


def openai_client(fleet: Fleet, key: str = "client-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.router.url}/v1", api_key=key, max_retries=0, timeout=20)


def anthropic_client(url: str, key: str = "client-key") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=20)


class Totals:
    """The gateway's usage totals and request counts, before and after."""

    def __init__(self, router: Proc, route: str) -> None:
        self.router, self.route = router, route
        self.prompt = metric(router, "kvrouter_prompt_tokens_total")
        self.cached = metric(router, "kvrouter_cached_tokens_total")
        self.ok = metric(router, "kvrouter_requests_total", route=route, code="200")

    def grew(self) -> tuple[float, float, float]:
        """(requests answered 200, prompt tokens, cached tokens) counted since."""
        r = self.router
        return (
            metric(r, "kvrouter_requests_total", route=self.route, code="200") - self.ok,
            metric(r, "kvrouter_prompt_tokens_total") - self.prompt,
            metric(r, "kvrouter_cached_tokens_total") - self.cached,
        )


# -- Responses ---------------------------------------------------------------------------------


def test_openai_responses_create_streamed_and_not_counts_usage(fleet: Fleet) -> None:
    totals = Totals(fleet.router, RESPONSES)
    prompt = cached = 0
    with openai_client(fleet) as c:
        for _ in range(2):
            r = c.responses.create(
                model=MODEL, instructions=SYSTEM, input="what next?", max_output_tokens=4
            )
            assert r.output_text and r.status == "incomplete"  # it ran into max_output_tokens
            assert r.usage is not None
            prompt += r.usage.input_tokens
            cached += r.usage.input_tokens_details.cached_tokens
        events = list(
            c.responses.create(model=MODEL, instructions=SYSTEM, input="what next?", stream=True)
        )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert done.output_text == deltas and done.usage is not None
    prompt += done.usage.input_tokens
    cached += done.usage.input_tokens_details.cached_tokens
    assert cached > 0  # the second and third found the first's prefix
    assert totals.grew() == (3, prompt, cached)
    assert_inflight_zero(fleet.router)


def test_previous_response_id_goes_to_the_engine_that_stored_it(fleet: Fleet) -> None:
    # engine-sim answers 404 for a response it does not hold: every continuation succeeding
    # means each went to the engine that stored its response.
    before = {e.url: fleet.stats(e)["requests"] for e in fleet.engines}
    with openai_client(fleet) as c:
        # New topics until both engines hold some: each lands where its hash does, and 8
        # land on one engine about once in 128 fleets (32 at most: once in 2 billion).
        first: list[Any] = []
        served: dict[str, int] = {}
        while len(first) < 8 or (not all(served.values()) and len(first) < 32):
            topic = f"topic {len(first)}: " + SYSTEM
            first.append(c.responses.create(model=MODEL, input=topic, max_output_tokens=2))
            served = {e.url: fleet.stats(e)["requests"] - before[e.url] for e in fleet.engines}
        assert all(served.values()), served
        for r in first:
            nxt = c.responses.create(
                model=MODEL, input="and then?", previous_response_id=r.id, max_output_tokens=2
            )
            assert nxt.usage is not None
            # The whole conversation is the engine's prompt, and its start is in its cache.
            assert nxt.usage.input_tokens_details.cached_tokens > 0
        with pytest.raises(openai.NotFoundError) as unknown:
            c.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")
    error = unknown.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert_inflight_zero(fleet.router)


# -- Messages ----------------------------------------------------------------------------------


def test_anthropic_messages_create_stream_and_count_tokens(fleet: Fleet) -> None:
    totals = Totals(fleet.router, MESSAGES)
    prompt = cached = 0
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    with anthropic_client(fleet.router.url) as c:
        m = c.messages.create(model=MODEL, max_tokens=3, system=SYSTEM, messages=messages)
        assert m.content[0].type == "text" and len(m.content[0].text.split()) == 3
        assert m.stop_reason == "max_tokens"
        prompt += m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
        cached += m.usage.cache_read_input_tokens or 0
        with c.messages.stream(
            model=MODEL, max_tokens=3, system=SYSTEM, messages=messages
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert final.content[0].type == "text" and final.content[0].text == text
        read = final.usage.cache_read_input_tokens or 0
        prompt += final.usage.input_tokens + read
        cached += read
        counted = c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages)
    assert read > 0  # the stream found the first answer's prefix
    assert counted.input_tokens == final.usage.input_tokens + read
    assert totals.grew() == (2, prompt, cached)  # count_tokens is no generation
    counts = metric(
        fleet.router, "kvrouter_requests_total", route="/v1/messages/count_tokens", code="200"
    )
    assert counts >= 1
    assert_inflight_zero(fleet.router)


def test_anthropic_errors_in_anthropic_shape(fleet: Fleet) -> None:
    with anthropic_client(fleet.router.url) as c:
        with pytest.raises(anthropic.NotFoundError) as nf:
            c.messages.create(
                model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(anthropic.BadRequestError) as bad:
            wrong: Any = [{"role": "user", "content": [{"type": 3}]}]
            c.messages.create(model=MODEL, max_tokens=2, messages=wrong)
    assert isinstance(nf.value.body, dict)
    assert nf.value.body["type"] == "error"
    assert nf.value.body["error"]["type"] == "not_found_error"
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].type" in bad.value.body["error"]["message"]
    assert_inflight_zero(fleet.router)


async def _stream_events(url: str, body: dict[str, Any]) -> list[sse.Event]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        assert resp.status == 200
        decoder = sse.Decoder()
        events: list[sse.Event] = []
        async for chunk in resp.content.iter_any():
            events.extend(decoder.feed(chunk))
        return events


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
def test_stream_broken_mid_way_ends_with_the_apis_error_event(fleet: Fleet, route: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "stream": True, "max_tokens": 8}
    if route == MESSAGES:
        body["messages"] = [{"role": "user", "content": f"break me {route}"}]
    else:
        body["input"] = f"break me {route}"
    for e in fleet.engines:
        fleet.fault(e, mode="drop-mid-stream")
    try:
        events = asyncio.run(_stream_events(fleet.router.url + route, body))
    finally:
        for e in fleet.engines:
            fleet.fault(e, mode="clear")
    last = events[-1]
    data = json.loads(last.data)
    assert last.event == "error" and data["type"] == "error"
    if route == MESSAGES:
        assert data["error"]["type"] == "api_error" and "request" in data["error"]["message"]
    else:
        assert data["code"] == "upstream_dropped" and data["message"]
    assert_inflight_zero(fleet.router)


# -- API keys ----------------------------------------------------------------------------------


def test_x_api_key_authenticates_like_a_bearer_key(tmp_path: Path, procs: list[Proc]) -> None:
    engine = start_kvrouter(["engine-sim", "--fast", "--model", MODEL], tmp_path)
    procs.append(engine)
    router = start_kvrouter(
        ["serve", "--backend", engine.url, "--host", "127.0.0.1"],
        tmp_path,
        env={"KVROUTER_API_KEYS": "team-a=secret-a"},
    )
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] == 1, "the engine healthy")
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with anthropic_client(router.url, "secret-a") as c:
        assert c.messages.create(model=MODEL, max_tokens=2, messages=messages).content
    with (
        anthropic_client(router.url, "wrong") as c,
        pytest.raises(anthropic.AuthenticationError) as denied,
    ):
        c.messages.create(model=MODEL, max_tokens=2, messages=messages)
    assert isinstance(denied.value.body, dict)
    assert denied.value.body["error"]["type"] == "authentication_error"
    bearer = openai.OpenAI(base_url=f"{router.url}/v1", api_key="secret-a", max_retries=0)
    with bearer:
        assert bearer.responses.create(model=MODEL, input="hi", max_output_tokens=2).output_text
    assert http_json(f"{engine.url}/stats")["requests"] == 2  # the refused one never left
