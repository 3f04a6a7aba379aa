"""Request body -> canonical routing text -> chained block keys."""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.blocks import (
    RequestShapeError,
    RoutingText,
    block_keys,
    routing_text,
)

B = 32  # small blocks keep the property tests fast and exercise many boundaries

texts = st.text(min_size=0, max_size=400)
ascii_texts = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=400)


def keys(text: str, model: str = "m", size: int = B) -> list[int]:
    return block_keys(RoutingText(model, text=text), size)


@given(prefix=texts, a=texts, b=texts)
def test_block_keys_shared_prefix_equal_leading_keys(prefix: str, a: str, b: str) -> None:
    ka, kb = keys(prefix + a), keys(prefix + b)
    shared = len(prefix) // B
    assert ka[:shared] == kb[:shared]


@given(text=texts.filter(lambda t: len(t) >= 1), data=st.data())
def test_block_keys_first_difference_at_k_changes_keys_from_k_div_size(
    text: str, data: Any
) -> None:
    k = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
    replacement = data.draw(st.characters().filter(lambda c: c != text[k]))
    other = text[:k] + replacement + text[k + 1 :]
    ka, kb = keys(text), keys(other)
    assert ka[: k // B] == kb[: k // B]
    for i in range(k // B, len(ka)):
        assert ka[i] != kb[i]


@given(text=texts)
def test_block_keys_other_model_disjoint_keys(text: str) -> None:
    assert not set(keys(text, "model-a")) & set(keys(text, "model-b"))


@given(text=ascii_texts)
def test_block_keys_only_full_blocks_get_keys(text: str) -> None:
    assert len(keys(text)) == len(text) // B


@given(text=ascii_texts)
def test_block_keys_ascii_fast_path_matches_general_path(text: str) -> None:
    # The ASCII path cuts encoded bytes; cutting the string must give the same keys.
    general = keys(text + "é")[: len(text) // B]
    assert keys(text) == general


def test_block_keys_token_ids_use_quarter_block() -> None:
    rt = RoutingText("m", token_ids=tuple(range(20)))
    assert len(block_keys(rt, 16)) == 5  # 16 chars ~ 4 tokens per block


CHAT = {
    "model": "llama",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
        },
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
}


def test_routing_text_json_key_order_and_whitespace_do_not_matter() -> None:
    reordered = json.loads(json.dumps(CHAT, sort_keys=True, indent=3))
    reordered["tools"][0]["function"]["parameters"] = {"a": 2, "b": 1}
    assert routing_text(CHAT) == routing_text(reordered)


def test_routing_text_growing_conversation_keeps_prefix() -> None:
    longer = dict(CHAT, messages=[*CHAT["messages"], {"role": "assistant", "content": "ok"}])
    short, long_ = routing_text(CHAT).text, routing_text(longer).text
    assert short is not None and long_ is not None and long_.startswith(short)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {"model": "m", "prompt": "abc"}, RoutingText("m", text="abc"), id="completion-string"
        ),
        pytest.param(
            {"model": "m", "prompt": [1, 2]},
            RoutingText("m", token_ids=array("I", [1, 2])),
            id="token-ids",
        ),
        pytest.param(
            {"model": "m", "prompt": [[1], [2]]},
            RoutingText("m", token_ids=array("I", [1, 2])),
            id="token-id-batch",
        ),
        pytest.param(
            {"model": "m", "input": "abc"}, RoutingText("m", text="abc"), id="embeddings-input"
        ),
        pytest.param(
            {"model": "m", "prompt": "x", "lora_adapter": "sql"},
            RoutingText("m\x1flora\x1fsql", text="x"),
            id="lora-namespace",
        ),
    ],
)
def test_routing_text_completions_shapes(body: dict[str, Any], expected: RoutingText) -> None:
    assert routing_text(body) == expected


def test_routing_text_image_part_by_hash_of_url() -> None:
    def body(url: str) -> dict[str, Any]:
        part = {"type": "image_url", "image_url": {"url": url}}
        return {"model": "m", "messages": [{"role": "user", "content": [part]}]}

    a, b = routing_text(body("data:image/png;base64,AAAA")), routing_text(body("data:x"))
    assert a != b
    assert a.text is not None and "AAAA" not in a.text


def test_routing_text_tool_calls_change_text() -> None:
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    base = {"model": "m", "messages": [{"role": "assistant", "content": None}]}
    with_call = {
        "model": "m",
        "messages": [{"role": "assistant", "content": None, "tool_calls": [call]}],
    }
    assert routing_text(base) != routing_text(with_call)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"messages": [{"role": "user", "content": "x"}]}, "model", id="no-model"),
        pytest.param({"model": 3, "prompt": "x"}, "model", id="model-not-string"),
        pytest.param({"model": "m", "messages": []}, "messages", id="empty-messages"),
        pytest.param({"model": "m", "messages": ["x"]}, "messages[0]", id="message-not-object"),
        pytest.param(
            {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", id="no-role"
        ),
        pytest.param(
            {"model": "m", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            id="content-number",
        ),
        pytest.param({"model": "m", "prompt": {"a": 1}}, "prompt", id="prompt-object"),
        pytest.param({"model": "m"}, "prompt", id="nothing-to-route"),
    ],
)
def test_routing_text_bad_shape_names_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestShapeError) as err:
        routing_text(body)
    assert err.value.param == param


# -- token ids are packed, and key the same as before -----------------------------------------

token_ids = st.lists(st.integers(min_value=-(2**40), max_value=2**40), min_size=1, max_size=60)


@given(ids=token_ids)
def test_routing_text_token_ids_packed_same_keys_as_ints(ids: list[int]) -> None:
    rt = routing_text({"model": "m", "prompt": ids})
    assert isinstance(rt.token_ids, array) and rt.token_ids.itemsize == 4
    assert list(rt.token_ids) == [t & 0xFFFFFFFF for t in ids]
    assert block_keys(rt, 16) == block_keys(RoutingText("m", token_ids=tuple(ids)), 16)


@given(batch=st.lists(token_ids, min_size=1, max_size=4))
def test_routing_text_token_id_batch_is_the_concatenation(batch: list[list[int]]) -> None:
    joined = routing_text({"model": "m", "prompt": batch}).token_ids
    assert joined is not None and list(joined) == [t & 0xFFFFFFFF for p in batch for t in p]


@pytest.mark.parametrize("prompt", [[1, True], [False], [1, 2.0], [[1], [True]]])
def test_routing_text_booleans_and_floats_are_not_token_ids(prompt: list[Any]) -> None:
    with pytest.raises(RequestShapeError) as e:
        routing_text({"model": "m", "prompt": prompt})
    assert e.value.param == "prompt"


# -- any JSON gets a routing text or a RequestShapeError, however deep -----------------------


def deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "tools": deep(5000)}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "functions": deep(5000)}, "functions"),
        (
            {"messages": [{"role": "assistant", "tool_calls": deep(5000)}]},
            "messages[0].tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "function_call": {"a": deep(5000)}}]},
            "messages[0].function_call",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "f": deep(5000)}]}]},
            "messages[0].content[0]",
        ),
    ],
    ids=["tools", "functions", "tool_calls", "function_call", "unknown-part"],
)
def test_routing_text_nested_too_deeply_names_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestShapeError) as e:
        routing_text({"model": "m", **body})
    assert e.value.param == param
    assert "nested too deeply" in str(e.value)


json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
json_trees = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=25,
)
fields = st.sampled_from(
    ["messages", "prompt", "input", "tools", "functions", "role", "content", "type", "text",
     "image_url", "url", "tool_calls", "function_call", "name", "tool_call_id", "lora_path"]
)  # fmt: skip
shaped = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(fields, inner, max_size=5),
    max_leaves=30,
)


@given(
    body=st.dictionaries(fields, shaped | json_trees, max_size=4),
    bury=st.sampled_from([None, None, "tools", "functions", "messages"]),
)
def test_fuzz_routing_text_only_request_shape_error(body: dict[str, Any], bury: str | None) -> None:
    if bury == "messages":  # a message whose tool calls are nested thousands deep
        rest = body.get(bury)
        more = rest[:2] if isinstance(rest, list) else []
        body[bury] = [{"role": "assistant", "tool_calls": deep(3000)}, *more]
    elif bury is not None:
        body[bury] = deep(3000)
    try:
        rt = routing_text({"model": "m", **body})
    except RequestShapeError as e:
        assert e.param and str(e)
        return
    block_keys(rt, B)
