"""engine-sim's token unit: the router's characters per token, and the router's block keys."""

from __future__ import annotations

from typing import Any

import pytest
import xxhash

from router.core.blocks import CHARS_PER_TOKEN, RoutingText, block_keys, routing_text
from router.enginesim.engine import Engine, SimSettings
from router.enginesim.requests import Endpoint, parse_generation
from router.enginesim.tokens import (
    OUTPUT_TOKENS,
    VOCABULARY,
    output_token,
    prefix_keys,
    prompt_tokens,
    text_tokens,
    token_ids,
)
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.enginesim.support import MODEL, chat, completion, prompt, raw


def text(value: str, model: str = MODEL) -> RoutingText:
    return routing_text({"model": model, "prompt": value})


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [
        pytest.param(0, 1, id="empty_counts_one"),
        pytest.param(CHARS_PER_TOKEN - 1, 1, id="below_one_token_counts_one"),
        pytest.param(CHARS_PER_TOKEN * 10, 10, id="whole_tokens"),
        pytest.param(CHARS_PER_TOKEN * 10 + 1, 10, id="partial_tail_not_a_token"),
    ],
)
def test_prompt_tokens_text_characters_over_chars_per_token(chars: int, tokens: int) -> None:
    assert prompt_tokens(text("x" * chars)) == tokens
    assert text_tokens("x" * chars) == tokens


def test_prompt_tokens_token_ids_one_token_each() -> None:
    rt = routing_text(completion(list(range(37))))
    assert prompt_tokens(rt) == 37


def test_prompt_tokens_chat_counts_the_router_canonical_text() -> None:
    # Role and separators are part of what the router hashes, so they count as prompt too.
    body = chat(prompt(30))
    rt = routing_text(body)
    assert rt.text is not None
    assert prompt_tokens(rt) == len(rt.text) // CHARS_PER_TOKEN > 30


def test_prompt_tokens_the_router_estimate() -> None:
    for n in (1, 5, 64, 513):
        rt = text(prompt(n))
        assert prompt_tokens(rt) == rt.approx_tokens == n


@pytest.mark.parametrize("n", [0, 3, 4, 5, 16, 39])
def test_prefix_keys_full_blocks_only(n: int) -> None:
    assert len(prefix_keys(text(prompt(n)), 4)) == n // 4


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(completion(prompt(300)), id="text"),
        pytest.param(chat(prompt(300)), id="chat"),
        pytest.param(completion(list(range(300))), id="token_ids"),
    ],
)
def test_prefix_keys_same_block_size_are_the_router_keys(body: dict[str, Any]) -> None:
    policy = load_policy(preset_path("kv-aware"))
    rt = routing_text(body)
    keys = prefix_keys(rt, policy.block_tokens)
    assert keys
    assert keys == block_keys(rt, policy.block_chars)


def test_prefix_keys_shared_prefix_shared_keys_then_differ() -> None:
    a = prefix_keys(text(prompt(40)), 4)
    b = prefix_keys(text(prompt(20) + prompt(20, start=500)), 4)
    assert a[:5] == b[:5]
    assert a[5] != b[5]


def test_prefix_keys_namespaced_by_model_and_adapter() -> None:
    same = prompt(40)
    plain = prefix_keys(text(same), 4)
    other_model = prefix_keys(text(same, model="m-2"), 4)
    adapter = prefix_keys(routing_text(completion(same, lora_adapter="a")), 4)
    assert not set(plain) & set(other_model)
    assert not set(plain) & set(adapter)


def test_output_tokens_each_chars_per_token_long() -> None:
    assert OUTPUT_TOKENS
    assert {len(t) for t in OUTPUT_TOKENS} == {CHARS_PER_TOKEN}


@pytest.mark.parametrize("n", [1, 7, 100])
def test_output_text_counts_back_as_as_many_tokens(n: int) -> None:
    answer = "".join(output_token(12345, i, 0) for i in range(n))
    assert text_tokens(answer) == n
    assert len(answer.split()) == n


def test_output_token_depends_on_seed_and_choice() -> None:
    first = [output_token(1, i, 0) for i in range(8)]
    assert first != [output_token(2, i, 0) for i in range(8)]
    assert first != [output_token(1, i, 1) for i in range(8)]
    assert first == [output_token(1, i, 0) for i in range(8)]


@pytest.mark.parametrize(
    ("shared", "router_tokens", "engine_tokens"),
    [
        pytest.param(0, 0, 0, id="nothing_shared"),
        pytest.param(128, 128, 128, id="one_router_block_same"),
        pytest.param(256, 256, 256, id="two_router_blocks_same"),
        pytest.param(300, 256, 288, id="mid_block_router_never_more"),
    ],
)
def test_engine_hit_matches_router_overlap_in_tokens(
    shared: int, router_tokens: int, engine_tokens: int
) -> None:
    # The router predicts an overlap in its 512-character blocks (128 tokens); the engine caches
    # in 16-token blocks. In one unit, a router block boundary is an engine block boundary: the
    # engine serves cached what the router predicted, plus any engine blocks past it.
    policy = load_policy(preset_path("kv-aware"))
    engine = Engine(SimSettings(fast=True))
    first = completion(prompt(400))
    second = completion(prompt(shared) + prompt(400 - shared, start=500))
    for body in (first, second):
        gen = parse_generation(raw(body), Endpoint.COMPLETIONS, engine.settings)
        ticket = engine.admit(gen.keys, gen.prompt_tokens, 1)
        engine.release(ticket)
    a, b = (block_keys(routing_text(body), policy.block_chars) for body in (first, second))
    overlap = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    assert overlap * policy.block_tokens == router_tokens
    assert ticket.cached == engine_tokens


def _ids_one_piece_at_a_time(text: str) -> list[int]:
    # The definition: the hash of each 4-character piece's UTF-8 bytes.
    return [
        xxhash.xxh3_64_intdigest(text[i : i + CHARS_PER_TOKEN].encode("utf-8")) % VOCABULARY
        for i in range(0, len(text) - CHARS_PER_TOKEN + 1, CHARS_PER_TOKEN)
    ]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("a fox ran far. " * 40 + "xy", id="ascii"),
        pytest.param("héllo wörld, ünïcode; " * 20 + "z", id="not_ascii"),
        pytest.param("", id="empty"),
    ],
)
def test_token_ids_one_per_piece_and_any_range_of_them(value: str) -> None:
    rt = text(value)
    assert rt.text is not None
    want = _ids_one_piece_at_a_time(rt.text)
    assert token_ids(rt) == want
    for start, end in [(0, 3), (5, 17), (len(want) - 2, len(want)), (7, 7), (3, None)]:
        assert token_ids(rt, start, end) == want[start:end]


def test_token_ids_of_a_token_id_prompt_are_its_ids() -> None:
    rt = routing_text(completion(list(range(40))))
    assert token_ids(rt) == list(range(40)) and token_ids(rt, 10, 12) == [10, 11]
