"""Responses and Messages bodies route on the same keys as their chat-completions form.

The same content keys alike through all three APIs; a conversation's turns share their
prefix keys in each; any body at all ends in a routing text or a ``RequestShapeError``; and a
10-turn agent conversation replayed through the simulator reaches the same hit ratio by each
door.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.agent_workload import APIS, AgentSpec, agent_bodies, agent_trace
from router.core.blocks import RequestShapeError, RoutingText, block_keys, routing_text
from router.core.chat_form import from_messages, from_responses
from router.core.engine_model import EngineSpec
from router.core.simulator import Fleet, simulate_policy
from router.presets import preset_path
from router.yaml_files import load_policy

M = "m"
IMAGE = "iVBORw0KGgo="


def text_of(api: str, body: dict[str, Any]) -> RoutingText:
    convert = {"responses": from_responses, "messages": from_messages}.get(api)
    return routing_text(body if convert is None else convert(body))


DATA_URL = f"data:image/png;base64,{IMAGE}"
PNG = {"type": "base64", "media_type": "image/png", "data": IMAGE}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def chat_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


CHAT_TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
RESPONSES_TOOL = {"type": "function", "name": "f", "description": "d", "parameters": {}}
MESSAGES_TOOL = {"name": "f", "description": "d", "input_schema": {}}

# (case, chat body, responses body, messages body): the same content by each door.
SAME_CONTENT = [
    (
        "system-and-user",
        {"messages": [{"role": "system", "content": "be brief"}, user("hi")]},
        {"instructions": "be brief", "input": "hi"},
        {"system": "be brief", "messages": [user("hi")]},
    ),
    (
        "text-parts",
        {"messages": [user([text("a"), "b"])]},
        {"input": [user([{"type": "input_text", "text": "a"}, "b"])]},
        {"messages": [user([text("a"), "b"])]},
    ),
    (
        "system-blocks",
        {"messages": [{"role": "system", "content": "one\ntwo"}, user("q")]},
        {"instructions": "one\ntwo", "input": [user("q")]},
        {"system": [text("one"), text("two")], "messages": [user("q")]},
    ),
    (
        "image",
        {"messages": [user([{"type": "image_url", "image_url": {"url": DATA_URL}}])]},
        {"input": [user([{"type": "input_image", "image_url": DATA_URL}])]},
        {"messages": [user([{"type": "image", "source": PNG}])]},
    ),
    (
        "tools-calls-results",
        {
            "tools": [CHAT_TOOL],
            "messages": [
                user("go"),
                {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [chat_call("c1", '{"a":1}'), chat_call("c2", '{"a":2}')],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
                user("thanks"),
            ],
        },
        {
            "tools": [RESPONSES_TOOL],
            "input": [
                user("go"),
                {"role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a":2}'},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
                user("thanks"),
            ],
        },
        {
            "tools": [MESSAGES_TOOL],
            "messages": [
                user("go"),
                {
                    "role": "assistant",
                    "content": [
                        text("calling"),
                        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                        {"type": "tool_use", "id": "c2", "name": "f", "input": {"a": 2}},
                    ],
                },
                user(
                    [
                        {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                        {"type": "tool_result", "tool_use_id": "c2", "content": [text("two")]},
                        text("thanks"),
                    ]
                ),
            ],
        },
    ),
]


@pytest.mark.parametrize(("chat", "responses", "messages"), [c[1:] for c in SAME_CONTENT],
                         ids=[c[0] for c in SAME_CONTENT])  # fmt: skip
def test_same_content_same_routing_text_through_every_door(
    chat: dict[str, Any], responses: dict[str, Any], messages: dict[str, Any]
) -> None:
    want = text_of("chat", {"model": M, **chat})
    assert text_of("responses", {"model": M, **responses}) == want
    assert text_of("messages", {"model": M, **messages}) == want


def test_other_items_and_blocks_route_on_a_stable_digest() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "s"}
    one = {"model": M, "messages": [{"role": "assistant", "content": [thinking]}]}
    two = {"model": M, "messages": [{"role": "assistant", "content": [dict(thinking)]}]}
    assert text_of("messages", one) == text_of("messages", two)
    changed = {**thinking, "thinking": "no"}
    other = {"model": M, "messages": [{"role": "assistant", "content": [changed]}]}
    assert text_of("messages", one) != text_of("messages", other)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    body = {"model": M, "input": [{"role": "user", "content": "q"}, reasoning]}
    assert "<reasoning:" in (text_of("responses", body).text or "")


@pytest.mark.parametrize("api", APIS)
def test_agent_turns_share_their_prefix_and_every_door_keys_alike(api: str) -> None:
    spec = AgentSpec(agents=2, turns=10)
    by_agent: dict[int, list[list[int]]] = {}
    for i, (_at, body) in enumerate(agent_bodies(spec, api)):
        by_agent.setdefault(i % spec.agents, []).append(block_keys(text_of(api, body), 512))
    assert len(by_agent) == 2
    for turns in by_agent.values():
        for before, after in itertools.pairwise(turns):
            assert len(after) > len(before) and after[: len(before)] == before
    chat = [text_of("chat", b) for _t, b in agent_bodies(spec, "chat")]
    assert [text_of(api, b) for _t, b in agent_bodies(spec, api)] == chat


words = st.text(alphabet="abc xyz", min_size=1, max_size=12)
turns = st.lists(st.tuples(words, words), min_size=1, max_size=6)


def _three(system: str, conversation: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    chat: list[dict[str, Any]] = [{"role": "system", "content": system}]
    items: list[dict[str, Any]] = []
    anthropic: list[dict[str, Any]] = []
    for asked, answer in conversation:
        chat += [{"role": "user", "content": asked}, {"role": "assistant", "content": answer}]
        said = [{"type": "output_text", "text": answer}]
        items += [
            {"role": "user", "content": [{"type": "input_text", "text": asked}]},
            {"type": "message", "role": "assistant", "content": said},
        ]
        anthropic += [
            {"role": "user", "content": [{"type": "text", "text": asked}]},
            {"role": "assistant", "content": answer},
        ]
    return {
        "chat": {"model": M, "messages": chat},
        "responses": {"model": M, "instructions": system, "input": items},
        "messages": {"model": M, "system": system, "messages": anthropic},
    }


@settings(max_examples=60, deadline=None)
@given(system=words, conversation=turns)
def test_growing_history_keeps_its_text_as_prefix_and_equal_across_apis(
    system: str, conversation: list[tuple[str, str]]
) -> None:
    for n in range(1, len(conversation) + 1):
        shorter, longer = (
            _three(system, conversation[: n - 1] or conversation[:0]),
            _three(system, conversation[:n]),
        )
        want = text_of("chat", longer["chat"])
        for api in APIS:
            got = text_of(api, longer[api])
            assert got == want
            if n > 1:
                assert (got.text or "").startswith(text_of(api, shorter[api]).text or "")


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "source", "id", "name", "input",
                         "tool_use_id", "call_id", "arguments", "output", "image_url",
                         "media_type", "data", "url", "input_schema", "parameters"]),
        inner,
        max_size=5,
    ),
    max_leaves=25,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(["responses", "messages"]),
    fields=st.dictionaries(
        st.sampled_from(["messages", "system", "input", "instructions", "tools"]), junk
    ),
)
def test_any_body_is_a_routing_text_or_a_shape_error(api: str, fields: dict[str, Any]) -> None:
    body = {"model": M, **fields}
    try:
        got = text_of(api, json.loads(json.dumps(body)))
    except RequestShapeError as e:
        assert e.param and str(e)
    else:
        assert got.namespace == M


def test_shape_errors_name_the_field_in_the_apis_own_terms() -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("messages", {"messages": [user([{"type": "tool_use", "name": "f", "id": 3}])]},
         "messages[0].content[0].id"),
        ("messages", {"messages": []}, "messages"),
        ("messages", {"system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
        ("responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
         "input[0].arguments"),
        ("responses", {"input": 3}, "input"),
        ("responses", {"instructions": [], "input": "x"}, "instructions"),
        ("responses", {"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ]  # fmt: skip
    for api, fields, param in cases:
        with pytest.raises(RequestShapeError) as e:
            text_of(api, {"model": M, **fields})
        assert e.value.param == param, (fields, e.value)


def test_ten_turn_agents_reach_the_same_hit_ratio_through_every_door() -> None:
    kv = load_policy(preset_path("kv-aware"))
    fleet = Fleet(4, EngineSpec(capacity_tokens=400_000))
    spec = AgentSpec(agents=8, turns=10)
    ratios = {api: simulate_policy(kv, agent_trace(spec, api), fleet).hit_ratio for api in APIS}
    assert ratios["chat"] > 0.5  # the history is reused: the comparison means something
    for api in ("responses", "messages"):
        assert abs(ratios[api] - ratios["chat"]) <= 0.01, ratios
