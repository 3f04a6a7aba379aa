"""Precise routing: event entries in the index, their sources, media, the bridge, the caps."""

from __future__ import annotations

from typing import Any

from router.core.decision import CoreSettings, RoutingCore
from router.core.engine_blocks import EngineBlocks
from router.core.index import BlockIndex, IndexLimits
from router.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from router.core.policy import load_policy_text
from router.core.precise import PreciseSettings, TokenPrompt

ENGINES = ["a", "b", "c"]
KV = "scorers: [{type: prefix-overlap, weight: 1}, {type: load, weight: 0.1}]\ncold_prefix: score\n"
# 2048 characters of text: 4 text blocks; its "token ids" are 256 ids, 16 blocks of 16.
TEXT = "".join(f"w{i:07d}" for i in range(256))
IDS = tuple(range(1000, 1256))


def core(settings: CoreSettings | None = None) -> RoutingCore:
    r = RoutingCore(load_policy_text("name: t\n" + KV, "t"), settings=settings)
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def body(text: str = TEXT) -> dict[str, Any]:
    return {"model": "m", "prompt": text}


def feed(r: RoutingCore, engine: str, blocks: EngineBlocks, *events: Any, now: float = 0.0) -> None:
    for e in events:
        change = blocks.apply(e)
        if change is not None:
            r.observe(engine, change, now)


def stored(ids: tuple[int, ...], first_hash: int, medium: str | None = None) -> BlockStored:
    n = len(ids) // 16
    hashes = tuple(range(first_hash, first_hash + n))
    return BlockStored(hashes, None, ids[: n * 16], 16, medium=medium)


def source(d: Any, engine: str) -> tuple[int, str]:
    c = next(c for c in d.explain()["candidates"] if c["engine"] == engine)
    return c["overlap_blocks"], c["overlap_source"]


def test_event_entries_route_to_the_engine_that_stored_them() -> None:
    r = core()
    r.set_precise("b", 16)
    feed(r, "b", EngineBlocks(1000), stored(IDS, 1))
    d = r.decide(body(), ENGINES, now=1.0, tokenized=TokenPrompt(IDS))
    assert d.engine == "b"
    assert source(d, "b") == (4, "event") and source(d, "a") == (0, "none")
    # Half the prompt held is half the text blocks.
    r2 = core()
    r2.set_precise("c", 16)
    feed(r2, "c", EngineBlocks(1000), stored(IDS[:128], 1))
    assert source(r2.decide(body(), ENGINES, 1.0, tokenized=TokenPrompt(IDS)), "c") == (2, "event")


def test_held_blocks_count_through_characters_whole_text_blocks() -> None:
    # A partial last text block (38 more ids, 304 characters) must not cut the held head
    # short: 256 of 294 ids held are the 4 whole text blocks they spell, not 3.48 of 4.
    text = TEXT + "y" * 304
    ids = IDS + tuple(range(5000, 5038))
    r = core()
    r.set_precise("b", 16)
    feed(r, "b", EngineBlocks(1000), stored(IDS, 1))
    d = r.decide(body(text), ENGINES, 1.0, tokenized=TokenPrompt(ids, text_chars=len(text)))
    assert source(d, "b") == (4, "event")


def test_ids_of_a_head_count_for_the_text_they_cover() -> None:
    # Only the first 128 ids are known (an earlier turn, 1,024 characters): the engine is
    # seen to hold that much of the prompt, two text blocks, whatever it holds beyond.
    r = core()
    r.set_precise("b", 16)
    feed(r, "b", EngineBlocks(1000), stored(IDS, 1))
    head = TokenPrompt(IDS[:128], text_chars=1024)
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=head), "b") == (2, "event")


def test_without_tokens_or_events_the_text_keys_answer() -> None:
    r = core()
    r.set_precise("b", 16)
    feed(r, "b", EngineBlocks(1000), stored(IDS, 1))
    d = r.decide(body(), ENGINES, now=1.0)  # tokenization failed: text keys only
    assert source(d, "b") == (0, "none")
    lease = r.acquire(d, "a", 1.0)
    r.record(lease, 1.0)
    r.release(lease)
    again = r.decide(body(), ENGINES, now=2.0, tokenized=TokenPrompt(IDS))
    assert source(again, "a") == (4, "approximate")  # an engine without events, same fleet
    assert source(again, "b") == (4, "event")


def test_routed_prefix_bridges_until_the_event_then_gives_way() -> None:
    r = core(CoreSettings(PreciseSettings(bridge_seconds=5.0)))
    r.set_precise("b", 16)
    d = r.decide(body(), ["b"], now=0.0, tokenized=TokenPrompt(IDS))
    lease = r.acquire(d, "b", 0.0)
    r.record(lease, 0.0)
    r.release(lease)
    tok = TokenPrompt(IDS)
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=tok), "b") == (4, "predicted")
    # No event came: the prediction lapses; the engine did not cache it.
    assert source(r.decide(body(), ENGINES, 6.0, tokenized=tok), "b") == (0, "none")
    # The event arrives (for half of it): the engine's word counts.
    feed(r, "b", EngineBlocks(1000), stored(IDS[:128], 1), now=6.0)
    assert source(r.decide(body(), ENGINES, 7.0, tokenized=tok), "b") == (2, "event")


def test_medium_weights_and_removal_and_clear() -> None:
    r = core()
    r.set_precise("b", 16)
    blocks = EngineBlocks(1000)
    feed(r, "b", blocks, stored(IDS, 1, medium="CPU"))
    tok = TokenPrompt(IDS)
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=tok), "b") == (2, "event")  # 0.5
    feed(r, "b", blocks, stored(IDS, 1))  # now on the GPU too: the best tier counts
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=tok), "b") == (4, "event")
    feed(r, "b", blocks, BlockRemoved((1,)))  # the GPU copy of the first block went
    # 0.5 + 15 x 1.0 of 16 blocks: 3.875 of the 4 text blocks, rounded down.
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=tok), "b") == (3, "event")
    assert r.index.event_blocks("b") == 31
    feed(r, "b", blocks, AllBlocksCleared())
    assert r.index.event_blocks("b") == 0 and len(r.index) == 0


def test_forget_clears_event_entries_and_degraded_engine_uses_text() -> None:
    r = core()
    r.set_precise("b", 16)
    feed(r, "b", EngineBlocks(1000), stored(IDS, 1))
    r.set_precise("b", None)  # degraded: its events are incomplete
    assert source(r.decide(body(), ENGINES, 1.0, tokenized=TokenPrompt(IDS)), "b") == (0, "none")
    r.forget("b")
    assert r.index.event_blocks() == 0 and len(r.index) == 0


def test_event_entries_bounded_by_the_global_cap() -> None:
    idx = BlockIndex(IndexLimits(engine_capacity_blocks=100, max_entries=640))
    for i in range(100):
        idx.store("e", list(range(i * 50, i * 50 + 50)), "gpu", float(i))
        idx.confirm("f", [10**9 + i], float(i))
    assert len(idx) <= 640
    assert len(idx) == idx.event_blocks() + idx.blocks("f")
    idx.drop_engine("e")
    assert idx.event_blocks() == 0 and len(idx) == idx.blocks("f")


def test_prompt_tokens_are_the_token_ids_when_known_not_characters_over_four() -> None:
    r = core()
    text = TEXT + "x" * 400  # ids stand for TEXT only: the rest is guessed at 4 chars a token
    assert r.decide(body(TEXT), ENGINES, 1.0).prompt_tokens == len(TEXT) // 4
    assert r.decide(body(TEXT), ENGINES, 1.0, tokenized=TokenPrompt(IDS)).prompt_tokens == 256
    head = TokenPrompt(IDS, text_chars=len(TEXT))
    assert r.decide(body(text), ENGINES, 1.0, tokenized=head).prompt_tokens == 256 + 100
