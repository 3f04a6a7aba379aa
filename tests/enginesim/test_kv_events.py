"""engine-sim publishes its prefix cache's KV events as vLLM does, and answers /tokenize.

A real ZMQ SUB (and DEALER, for replays) on loopback reads what the engine sends; the
router's own decoder (router.core.kv_events) reads it back, so the keys it derives from the
events must equal the keys of the ids ``/tokenize`` gives for the same prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from router.core.blocks import token_keys
from router.core.engine_blocks import EngineBlocks
from router.core.engine_model import EngineSpec
from router.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Counts,
    decode_batch,
    split_message,
    split_replay,
)
from router.enginesim.app import serving
from router.enginesim.kv_publisher import EventSettings
from router.enginesim.model_files import write_tokenizer
from router.local_tokenizer import LocalTokenizer
from tests.enginesim.support import FAST, MODEL, chat, post, prompt
from tests.support import eventually, free_port

BLOCK = 4


@asynccontextmanager
async def publishing(
    tokenizer: LocalTokenizer | None = None, **kw: Any
) -> AsyncIterator[tuple[aiohttp.ClientSession, zmq.asyncio.Socket, str]]:
    """An engine publishing events, an HTTP session to it, a SUB socket, the replay address."""
    port, replay = free_port(), free_port()
    events = EventSettings(port=port, replay_port=replay, topic="kv", **kw)
    spec = EngineSpec(capacity_tokens=BLOCK * 8, block_tokens=BLOCK)
    settings = dataclasses.replace(FAST, spec=spec, events=events, tokenizer=tokenizer)
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        async with serving(settings) as url, aiohttp.ClientSession(url) as http:
            sub.connect(f"tcp://127.0.0.1:{port}")

            # A SUB misses what is sent before its subscription arrives: reset until one lands.
            async def an_event_reached_the_subscriber() -> bool:
                await post(http, "/reset", {})
                return bool(await sub.poll(50))

            await eventually(an_event_reached_the_subscriber, interval=0.01)
            await drain(sub)
            yield http, sub, f"tcp://127.0.0.1:{replay}"
    finally:
        sub.close(0)
        ctx.term()


async def drain(sub: zmq.asyncio.Socket) -> list[list[bytes]]:
    out = []
    while await sub.poll(20):
        out.append(await sub.recv_multipart())
    return out


async def next_events(sub: zmq.asyncio.Socket) -> tuple[int, list[Any]]:
    assert await sub.poll(5000), "no event batch"
    topic, seq, payload = split_message(await sub.recv_multipart())
    assert topic == b"kv"
    counts = Counts()
    batch = decode_batch(payload, counts)
    assert batch is not None and counts.malformed == counts.unknown_fields == 0
    return seq, list(batch.events)


async def tokenize(http: aiohttp.ClientSession, body: dict[str, Any]) -> list[int]:
    status, got = await post(http, "/tokenize", body)
    assert status == 200 and got["count"] == len(got["tokens"])
    tokens: list[int] = got["tokens"]
    return tokens


@pytest.mark.parametrize(
    ("encoding", "hashes"), [("map", "int"), ("array", "bytes"), ("array", "int"), ("map", "bytes")]
)
async def test_events_key_to_the_tokenized_prompt(encoding: str, hashes: str) -> None:
    async with publishing(encoding=encoding, hashes=hashes) as (http, sub, _):
        body = chat(prompt(10))
        ids = await tokenize(http, {"model": MODEL, "messages": body["messages"]})
        assert (await post(http, "/v1/chat/completions", body))[0] == 200
        _, events = await next_events(sub)
        (stored,) = events
        assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
        assert stored.block_size == BLOCK and stored.medium == "GPU"
        assert isinstance(stored.block_hashes[0], int if hashes == "int" else bytes)
        blocks = EngineBlocks(100)
        change = blocks.apply(stored)
        assert change is not None and list(change.stored) == token_keys(ids, BLOCK)
        # A longer prompt on the same prefix stores only its new blocks, linked to the old.
        longer = chat(prompt(10) + prompt(8, start=50))
        await post(http, "/v1/chat/completions", longer)
        _, events = await next_events(sub)
        (more,) = events
        assert isinstance(more, BlockStored) and more.parent_block_hash is not None
        more_ids = await tokenize(http, {"model": MODEL, "messages": longer["messages"]})
        change = blocks.apply(more)
        assert change is not None
        assert list(change.stored) == token_keys(more_ids, BLOCK)[len(stored.block_hashes) :]


async def test_with_a_tokenizer_events_carry_its_ids(tmp_path: Path) -> None:
    local = LocalTokenizer.load(write_tokenizer(tmp_path))
    async with publishing(tokenizer=local) as (http, sub, _):
        body = chat("rule 3 keep answers short")  # fewer than the cache's 8 blocks
        ids = await tokenize(http, {"model": MODEL, "messages": body["messages"]})
        assert ids == local.ids(body)  # the router's local tokenizer computes the same
        status, answer = await post(http, "/v1/chat/completions", body)
        assert status == 200 and answer["usage"]["prompt_tokens"] == len(ids)
        _, events = await next_events(sub)
        (stored,) = events
        assert isinstance(stored, BlockStored)
        assert list(stored.token_ids) == ids[: len(ids) // BLOCK * BLOCK]
        # A prompt given as ids is its ids, tokenizer or not.
        assert await tokenize(http, {"model": MODEL, "prompt": [5, 6, 7]}) == [5, 6, 7]


async def test_evictions_reset_and_replay() -> None:
    async with publishing() as (http, sub, replay):
        seqs = []
        for i in range(3):  # 3 x 4 blocks into a cache of 8: the third evicts
            await post(http, "/v1/completions", {"model": MODEL, "prompt": prompt(16, 100 * i)})
            seq, events = await next_events(sub)
            seqs.append(seq)
        assert any(isinstance(e, BlockRemoved) for e in events)
        await post(http, "/reset", {})
        seq, events = await next_events(sub)
        assert events == [AllBlocksCleared()] and seq == seqs[-1] + 1
        # A DEALER asks for everything from the first request on: each batch, then the end.
        ctx = zmq.asyncio.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(replay)
            await dealer.send_multipart([b"", seqs[0].to_bytes(8, "big")])
            got = []
            for _ in range(10):
                assert await dealer.poll(5000), "no replay answer"
                item = split_replay(await dealer.recv_multipart())
                if item is None:
                    break
                got.append(item[0])
            assert got == [*seqs, seq]
        finally:
            dealer.close(0)
            ctx.term()


async def test_tokenize_prompt_and_errors() -> None:
    async with publishing() as (http, _sub, _):
        ids = await tokenize(http, {"model": MODEL, "prompt": prompt(6)})
        assert len(ids) == 6 and ids == await tokenize(http, {"model": MODEL, "prompt": prompt(6)})
        assert await tokenize(http, {"model": MODEL, "prompt": [5, 6, 7]}) == [5, 6, 7]
        assert (await post(http, "/tokenize", {"model": "other", "prompt": "x"}))[0] == 404
        assert (await post(http, "/tokenize", {"model": MODEL}))[0] == 400
    await asyncio.sleep(0)


async def test_decode_engine_publishes_the_blocks_it_pulled() -> None:
    # A vLLM engine of any role decodes what a prefill engine answered: it pulls the prompt
    # and holds its blocks, as events say.
    async with (
        publishing() as (http, sub, _),
        serving(FAST) as prefill_url,
        aiohttp.ClientSession(prefill_url) as prefill,
    ):
        body = chat(prompt(10))
        ask = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        status, answer = await post(prefill, "/v1/chat/completions", ask)
        assert status == 200
        decode = {**body, "kv_transfer_params": answer["kv_transfer_params"]}
        status, out = await post(http, "/v1/chat/completions", decode)
        assert status == 200
        _, events = await next_events(sub)
        (stored,) = events
        assert isinstance(stored, BlockStored)
        ids = await tokenize(http, {"model": MODEL, "messages": body["messages"]})
        blocks = EngineBlocks(100)
        change = blocks.apply(stored)
        assert change is not None and list(change.stored) == token_keys(ids, BLOCK)
        assert out["usage"]["prompt_tokens"] == len(ids)
        async with http.get("/stats") as resp:
            got = await resp.json()
        assert (got["decoded_from_remote"], got["transferred_tokens"]) == (1, len(ids))
