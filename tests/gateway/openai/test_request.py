"""Parsing inbound requests: clear 400s for bad input, and no input that raises anything else."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from array import array
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.gateway.openai import request as inbound_module
from router.gateway.openai.errors import BadRequest
from router.gateway.openai.request import (
    PROMPT_FIELD,
    BodyParser,
    Inbound,
    parse,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("route", "body", "param", "says"),
    [
        (CHAT, b"", None, "the request body is empty"),
        (CHAT, b"{", None, "not valid JSON"),
        (CHAT, b"\xff\xfe", None, "not valid JSON"),
        (CHAT, b"[1]", None, "must be a JSON object, got an array"),
        (CHAT, b'"x"', None, "must be a JSON object, got a string"),
        (CHAT, raw({"messages": [{"role": "user", "content": "x"}]}), "model", "(missing)"),
        (CHAT, raw({"model": 3, "messages": []}), "model", "got a number"),
        (CHAT, raw({"model": "", "messages": []}), "model", "non-empty string"),
        (CHAT, raw({"model": "m"}), "messages", "'messages' is required"),
        (CHAT, raw({"model": "m", "messages": []}), "messages", "non-empty array"),
        (CHAT, raw({"model": "m", "messages": "hi"}), "messages", "non-empty array"),
        (CHAT, raw({"model": "m", "messages": [1]}), "messages[0]", "must be an object"),
        (
            CHAT,
            raw({"model": "m", "messages": [{"role": 1, "content": "x"}]}),
            "messages[0].role",
            "must be a string",
        ),
        (
            CHAT,
            raw({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "string or an array",
        ),
        (
            CHAT,
            raw({"model": "m", "messages": [{"role": "u", "content": "x"}], "stream": "yes"}),
            "stream",
            "'stream' must be a boolean, got a string",
        ),
        (COMPLETIONS, raw({"model": "m"}), "prompt", "'prompt' is required"),
        (COMPLETIONS, raw({"model": "m", "prompt": 3}), "prompt", "must be a string"),
        (COMPLETIONS, raw({"model": "m", "prompt": [1, "a"]}), "prompt", "token ids"),
        (EMBEDDINGS, raw({"model": "m"}), "input", "'input' is required"),
        (EMBEDDINGS, raw({"model": "m", "input": {}}), "input", "must be a string"),
        (CHAT, b'{"model": "m", "messages": [{"role": "u", "content": 1e999}]}', None, "JSON"),
        # orjson reads an integer beyond 64 bits as a float, which is no token id
        (
            COMPLETIONS,
            b'{"model": "m", "prompt": [123456789012345678901234567890]}',
            "prompt",
            "ids",
        ),
    ],
)
def test_parse_bad_body_400_names_field(
    route: str, body: bytes, param: str | None, says: str
) -> None:
    with pytest.raises(BadRequest) as e:
        parse(body, route)
    assert e.value.status == 400
    assert e.value.param == param
    assert says in e.value.message


@pytest.mark.parametrize(
    ("route", "body", "stream"),
    [
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, False),
        (
            CHAT,
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            True,
        ),
        (COMPLETIONS, {"model": "m", "prompt": "hi", "stream": None}, False),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, False),
        (EMBEDDINGS, {"model": "m", "input": ["a", "b"]}, False),
        (EMBEDDINGS, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, False),
    ],
)
def test_parse_good_body_keeps_model_and_stream(
    route: str, body: dict[str, Any], stream: bool
) -> None:
    got = parse(raw(body), route)
    assert got.model == "m"
    assert got.stream is stream
    assert got.text.namespace == "m"


# -- deep JSON: a 400 naming the field, never a RecursionError ---------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("template", "param"),
    [
        ('"messages": [{"role": "user", "content": "x"}], "tools": %s', "tools"),
        ('"messages": [{"role": "user", "content": "x"}], "functions": %s', "functions"),
        (
            '"messages": [{"role": "assistant", "content": null, "tool_calls": %s}]',
            "messages[0].tool_calls",
        ),
        (
            '"messages": [{"role": "user", "content": [{"type": "audio", "x": %s}]}]',
            "messages[0].content[0]",
        ),
    ],
    ids=["tools", "functions", "tool_calls", "unknown-part"],
)
@pytest.mark.parametrize("depth", [1000, 1015])
def test_parse_deeply_nested_json_400_names_field(template: str, param: str, depth: int) -> None:
    body = ('{"model": "m", ' + template % nested(depth) + "}").encode()
    with pytest.raises(BadRequest) as e:
        parse(body, CHAT)
    assert e.value.status == 400
    assert e.value.param == param
    assert "nested too deeply" in e.value.message


def test_parse_nesting_beyond_json_parser_400() -> None:
    body = ('{"model": "m", "messages": [], "tools": ' + nested(1100) + "}").encode()
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse(body, CHAT)


def test_parse_moderately_nested_tools_route() -> None:
    body = '{"model": "m", "messages": [{"role": "u", "content": "x"}], "tools": ' + nested(200)
    got = parse((body + "}").encode(), CHAT)
    assert got.text.text is not None and nested(200) in got.text.text


# -- the gateway's parser: bounded memory, large bodies off the event loop ----------------------


def test_body_parser_keeps_scalars_and_text_not_prompt() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function"}],
        "stream": True,
        "user": "alice",
        "priority": 3,
        "temperature": 0.5,
        "stream_options": {"include_usage": True},
    }
    got = asyncio.run(BodyParser().parse(raw(body), CHAT))
    assert got.body == {
        "model": "m",
        "stream": True,
        "user": "alice",
        "priority": 3,
        "temperature": 0.5,
    }
    assert got.text == parse(raw(body), CHAT).text and got.stream and got.model == "m"


def test_body_parser_keep_body_keeps_everything() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    got = asyncio.run(BodyParser(keep_body=True).parse(raw(body), CHAT))
    assert got.body == body


def test_body_parser_token_ids_packed_four_bytes_each() -> None:
    ids = list(range(1000, 1000 + 50_000))
    body = raw({"model": "m", "prompt": ids})
    got = asyncio.run(BodyParser(large_bytes=1024).parse(body, COMPLETIONS))
    assert isinstance(got.text.token_ids, array) and got.text.token_ids.itemsize == 4
    assert list(got.text.token_ids) == ids


def test_body_parser_large_bodies_in_a_thread_one_at_a_time() -> None:
    threads: dict[bool, set[int]] = {True: set(), False: set()}  # large? -> threads
    running = peak = 0
    lock = threading.Lock()
    real = inbound_module._parse_light

    def spy(data: bytes, route: str) -> Inbound:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            threads[len(data) > 100].add(threading.get_ident())
        try:
            time.sleep(0.01)  # hold the slot long enough for the others to queue behind it
            return real(data, route)
        finally:
            with lock:
                running -= 1

    async def main() -> list[Inbound]:
        p = BodyParser(large_bytes=100, max_large=1)
        big = raw({"model": "m", "prompt": "x" * 200})
        small = raw({"model": "m", "prompt": "x"})
        got = await asyncio.gather(*(p.parse(big, COMPLETIONS) for _ in range(4)))
        got.append(await p.parse(small, COMPLETIONS))
        return got

    inbound_module._parse_light = spy  # type: ignore[assignment]
    try:
        got = asyncio.run(main())
    finally:
        inbound_module._parse_light = real
    assert [g.text.text for g in got] == ["x" * 200] * 4 + ["x"]
    assert threads[False] == {threading.get_ident()}  # a small body: on the event loop
    assert threads[True] and threading.get_ident() not in threads[True]  # large: never
    assert peak == 1


def test_body_parser_client_gone_keeps_slot_until_thread_ends() -> None:
    started, release = threading.Event(), threading.Event()
    real = inbound_module._parse_light

    def slow(data: bytes, route: str) -> Inbound:
        started.set()
        release.wait(10)
        return real(data, route)

    async def main() -> None:
        p = BodyParser(large_bytes=10, max_large=1)
        big = raw({"model": "m", "prompt": "x" * 100})
        first = asyncio.create_task(p.parse(big, COMPLETIONS))
        await asyncio.to_thread(started.wait, 10)
        first.cancel()  # the client left; its parse cannot be stopped
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(p.parse(big, COMPLETIONS))
        await asyncio.sleep(0.05)
        assert not second.done()  # waits: the first thread still holds the memory
        release.set()
        assert (await asyncio.wait_for(second, 10)).text.text == "x" * 100

    inbound_module._parse_light = slow  # type: ignore[assignment]
    try:
        asyncio.run(main())
    finally:
        release.set()
        inbound_module._parse_light = real


def test_body_parser_bad_large_body_400() -> None:
    p = BodyParser(large_bytes=10)
    with pytest.raises(BadRequest) as e:
        asyncio.run(p.parse(raw({"model": "m", "prompt": [1, "x"] * 20}), COMPLETIONS))
    assert e.value.param == "prompt"


# -- fuzzing: no input raises anything but BadRequest -------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
keys = st.sampled_from(
    ["model", "messages", "prompt", "input", "stream", "role", "content", "type", "text",
     "image_url", "url", "tools", "tool_calls", "name", "user", "lora_path", "system",
     "instructions", "id", "input_schema", "tool_use_id", "call_id", "arguments", "output",
     "source"]
)  # fmt: skip
# Bodies shaped like requests, so that fuzzing reaches deep into the message checks.
shaped = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=40,
)
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "", 1, None])},
    optional={
        "messages": shaped,
        "prompt": shaped,
        "input": shaped,
        "stream": shaped,
        "system": shaped,
        "instructions": shaped,
        "tools": shaped,
    },
)


def _only_bad_request(data: bytes, route: str) -> None:
    try:
        parse(data, route)
    except BadRequest as e:
        assert e.status == 400 and e.message


routes = st.sampled_from(sorted(PROMPT_FIELD))
fuzz = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(st.binary(max_size=200), routes)
def test_fuzz_parse_any_bytes_only_bad_request(data: bytes, route: str) -> None:
    _only_bad_request(data, route)


@fuzz
@given(json_values, routes)
def test_fuzz_parse_any_json_only_bad_request(value: Any, route: str) -> None:
    _only_bad_request(json.dumps(value).encode(), route)


@fuzz
@given(bodies, routes)
def test_fuzz_parse_request_shaped_json_only_bad_request(value: Any, route: str) -> None:
    _only_bad_request(json.dumps(value).encode(), route)


def test_parse_front_doors_route_on_their_chat_form() -> None:
    chat = parse(json.dumps(CHAT_HI).encode(), "/v1/chat/completions")
    messages = parse(json.dumps(MESSAGES_HI).encode(), "/v1/messages")
    responses = parse(json.dumps(RESPONSES_HI).encode(), "/v1/responses")
    assert messages.text == chat.text == responses.text
    assert messages.stream and not responses.stream
    assert messages.prompt_body == CHAT_HI  # text blocks joined, as a template renders them
    assert chat.prompt_body is chat.body  # a chat body is its own chat form


def test_parse_count_tokens_checks_the_body_and_routes_on_no_prefix() -> None:
    got = parse(json.dumps(MESSAGES_HI).encode(), "/v1/messages/count_tokens")
    assert got.text.text == "" and got.text.namespace == "m" and got.chat is None
    with pytest.raises(BadRequest) as e:
        parse(b'{"model": "m", "messages": [{"role": 3}]}', "/v1/messages/count_tokens")
    assert e.value.param == "messages[0].role"


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/responses", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "input"),
        ("/v1/responses", {"model": "m", "input": [{"type": 7}]}, "input[0].type"),
        ("/v1/messages", {"model": "m", "input": "x"}, "messages"),
        ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": 5}]},
         "messages[0].content"),
    ],
)  # fmt: skip
def test_parse_front_door_bad_bodies_400_name_their_field(
    route: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as e:
        parse(json.dumps(body).encode(), route)
    assert e.value.param == param


def test_body_parser_light_keeps_no_chat_form_keep_body_does() -> None:
    raw = json.dumps(MESSAGES_HI).encode()
    light = asyncio.run(BodyParser().parse(raw, "/v1/messages"))
    kept = asyncio.run(BodyParser(keep_body=True).parse(raw, "/v1/messages"))
    assert light.chat is None and kept.chat is not None and light.text == kept.text


CHAT_HI: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
}
MESSAGES_HI = {
    "model": "m",
    "system": "sys",
    "max_tokens": 3,
    "stream": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
}
RESPONSES_HI = {"model": "m", "instructions": "sys", "input": "hi"}
