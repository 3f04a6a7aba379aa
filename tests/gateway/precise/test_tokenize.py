"""The router's tokenizer client: engines' POST /tokenize, the cache, heads of conversations,
and the local tokenizer's worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson
import pytest
from aiohttp import web

from router.core.blocks import CHARS_PER_TOKEN
from router.enginesim.app import serving
from router.enginesim.engine import SimSettings
from router.enginesim.model_files import write_tokenizer
from router.enginesim.tokens import token_ids
from router.gateway.openai.request import Inbound, parse
from router.gateway.precise.tokenize import (
    HEAD_MARGIN_IDS,
    LOCAL_PENDING,
    PARTIAL_ABOVE,
    PARTIAL_CHARS,
    Tokenizer,
)
from router.local_tokenizer import LocalTokenizer
from tests.support import LOOPBACK, free_port

MODEL = "m"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def inbound(prompt: str | list[int]) -> Inbound:
    return parse(orjson.dumps({"model": MODEL, "prompt": prompt}), "/v1/completions")


def words(start: int, n: int) -> str:
    """``n`` words of 8 characters (two tokens each), numbered from ``start``."""
    return "".join(f"w{i:06d} " for i in range(start, start + n))


async def engine_ids(request: web.Request) -> web.Response:
    """A /tokenize that answers as engine-sim does."""
    ids = token_ids(parse(await request.read(), "/v1/completions").text)
    return web.Response(body=orjson.dumps({"tokens": ids, "count": len(ids)}))


@contextlib.asynccontextmanager
async def engines(
    n: int, handler: Handler = engine_ids
) -> AsyncIterator[tuple[list[str], list[list[str]]]]:
    """``n`` engines answering ``/tokenize`` with ``handler``; yields their URLs and, per
    engine, the prompts it was asked to tokenize."""
    runners, urls, asked = [], [], []
    for _ in range(n):
        seen: list[str] = []

        async def tokenize(request: web.Request, seen: list[str] = seen) -> web.StreamResponse:
            seen.append(orjson.loads(await request.read()).get("prompt"))
            return await handler(request)

        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, LOOPBACK, port).start()
        runners.append(runner)
        urls.append(f"http://{LOOPBACK}:{port}")
        asked.append(seen)
    try:
        yield urls, asked
    finally:
        for r in runners:
            await r.cleanup()


async def settled(tok: Tokenizer) -> None:
    """Until the background calls are done (bounded)."""
    for _ in range(500):
        if not tok.pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("background tokenizations did not finish")


async def test_tokenizer_calls_spread_over_the_precise_engines() -> None:
    async with engines(2) as (urls, asked):
        tok = Tokenizer(5.0, lambda _model: urls)
        try:
            for i in range(4):
                req = inbound(words(1000 * i, 10))
                got = await tok(req)
                assert got is not None and list(got.token_ids) == token_ids(req.text)
        finally:
            await tok.close()
    assert [len(a) for a in asked] == [2, 2]


async def test_tokenizer_next_turn_routes_on_the_cached_head_at_once() -> None:
    first = words(0, 200)  # 1,600 characters, 400 tokens
    second = first + words(500, 100)  # the next turn: the history and more
    third = second + words(900, 100)
    async with engines(1) as (urls, asked):
        tok = Tokenizer(5.0, lambda _model: urls)
        try:
            whole = await tok(inbound(first))
            assert whole is not None and whole.text_chars == len(first)
            head = await tok(inbound(second))
            # No call waited on: the first turn's ids, less the margin, stand for its start.
            assert head is not None
            n = len(first) // CHARS_PER_TOKEN - HEAD_MARGIN_IDS
            assert list(head.token_ids) == list(whole.token_ids)[:n]
            assert head.text_chars == n * CHARS_PER_TOKEN
            # Meanwhile the whole second turn is tokenized, so the third finds it.
            await settled(tok)
            assert asked[0] == [first, second]
            again = await tok(inbound(second))
            assert again is not None and list(again.token_ids) == token_ids(inbound(second).text)
            later = await tok(inbound(third))
            assert later is not None
            assert len(later.token_ids) == len(second) // CHARS_PER_TOKEN - HEAD_MARGIN_IDS
            await settled(tok)
        finally:
            await tok.close()
    assert asked[0] == [first, second, third]


async def test_tokenizer_a_prompt_that_only_shares_a_start_is_asked() -> None:
    a = words(0, 200) + words(5000, 50)
    b = words(0, 200) + words(7000, 50)  # same start, another continuation: not a's next turn
    async with engines(1) as (urls, asked):
        tok = Tokenizer(5.0, lambda _model: urls)
        try:
            await tok(inbound(a))
            got = await tok(inbound(b))
            assert got is not None and list(got.token_ids) == token_ids(inbound(b).text)
        finally:
            await tok.close()
    assert asked[0] == [a, b]


def answer(value: Any) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"tokens": value}))

    return handler


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param([1, True], id="bool"),
        pytest.param([1, -2], id="negative"),
        pytest.param([1, 2.0], id="float"),
        pytest.param([1, 1 << 32], id="beyond_32_bits"),
        pytest.param("12", id="string"),
        pytest.param(None, id="missing"),
    ],
)
async def test_tokenizer_bad_answer_falls_back_to_text_keys(bad: Any) -> None:
    outcomes: list[bool] = []
    async with engines(1, answer(bad)) as (urls, _asked):
        tok = Tokenizer(5.0, lambda _model: urls, lambda _s, ok: outcomes.append(ok))
        try:
            assert await tok(inbound(words(0, 10))) is None
        finally:
            await tok.close()
    assert outcomes == [False]


async def test_tokenizer_token_id_prompts_and_no_engine_need_no_call() -> None:
    async with engines(1) as (urls, asked):
        tok = Tokenizer(5.0, lambda model: urls if model == MODEL else [])
        try:
            got = await tok(inbound([5, 6, 7]))
            assert got is not None and list(got.token_ids) == [5, 6, 7]
            assert got.text_chars == 3 * CHARS_PER_TOKEN
            other = parse(orjson.dumps({"model": "x", "prompt": "hi"}), "/v1/completions")
            assert await tok(other) is None
        finally:
            await tok.close()
    assert asked == [[]]


async def test_tokenizer_close_stops_background_calls() -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        if "w000500" in (await request.text()):
            await release.wait()  # the second turn's call hangs until the test ends
        return await engine_ids(request)

    async with engines(1, slow) as (urls, _asked):
        tok = Tokenizer(30.0, lambda _model: urls)
        await tok(inbound(words(0, 200)))
        assert await tok(inbound(words(0, 200) + words(500, 10))) is not None
        assert tok.pending == 1
        await tok.close()
        assert tok.pending == 0
        release.set()


# A local tokenizer (--tokenizer PATH): exact ids on worker threads, no engine asked.


class Gated(LocalTokenizer):
    """The model's tokenizer, counting its jobs; each waits for ``gate`` when it is set."""

    def __init__(self, inner: LocalTokenizer) -> None:
        self.inner = inner
        self.jobs = 0
        self.gate: threading.Event | None = None

    def text_of(self, body: Mapping[str, Any]) -> tuple[str, bool]:
        self.jobs += 1
        if self.gate is not None:
            self.gate.wait(10)
        return self.inner.text_of(body)

    def encode(self, text: str, special_tokens: bool) -> list[int]:
        return self.inner.encode(text, special_tokens)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalTokenizer:
    return LocalTokenizer.load(write_tokenizer(tmp_path_factory.mktemp("model")))


def chat(text: str) -> Inbound:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return parse(orjson.dumps(body), "/v1/chat/completions")


async def test_local_tokenizer_gives_exact_ids_and_asks_no_engine(model: LocalTokenizer) -> None:
    outcomes: list[tuple[bool, bool]] = []
    local = Gated(model)
    async with engines(1) as (urls, asked):
        tok = Tokenizer(
            5.0, lambda _m: urls, lambda s, ok: outcomes.append((s is not None, ok)), local=local
        )
        try:
            req = chat(words(0, 50))
            got = await tok(req)
            assert got is not None
            assert list(got.token_ids) == model.ids(req.body)
            assert got.text_chars == len(req.text.text or "")
            again = await tok(chat(words(0, 50)))  # the same prompt: from the cache
            assert again is not None and list(again.token_ids) == list(got.token_ids)
            longer = await tok(chat(words(0, 50) + words(90, 5)))  # no head: tokenized whole
            assert longer is not None and len(longer.token_ids) > len(got.token_ids)
        finally:
            await tok.close()
    assert asked == [[]]
    assert local.jobs == 2
    assert outcomes == [(True, True), (True, True)]


async def test_local_tokenizer_next_turn_routes_on_the_cached_head_at_once(
    model: LocalTokenizer,
) -> None:
    local = Gated(model)
    first = chat(words(0, 200))  # past a head chunk: the next turn finds it
    second = chat(words(0, 200) + words(500, 50))
    tok = Tokenizer(5.0, lambda _m: ["http://engine"], local=local)
    try:
        whole = await tok(first)
        assert whole is not None and list(whole.token_ids) == model.ids(first.body)
        local.gate = threading.Event()  # the next encode waits: the head must not
        head = await tok(second)
        assert head is not None
        assert (
            list(head.token_ids) == list(whole.token_ids)[: len(whole.token_ids) - HEAD_MARGIN_IDS]
        )
        assert tok.pending == 1  # the whole second turn, on a worker thread
        local.gate.set()
        await settled(tok)
        again = await tok(second)
        assert again is not None and list(again.token_ids) == model.ids(second.body)
        assert local.jobs == 2
    finally:
        if local.gate is not None:
            local.gate.set()
        await tok.close()


@pytest.mark.parametrize("held", [False, True], ids=["start-not-held", "start-held"])
async def test_local_tokenizer_long_prompt_encodes_its_start_first(
    model: LocalTokenizer, held: bool
) -> None:
    local = Gated(model)
    asked: list[tuple[str, str | None, int]] = []

    def holds(m: str, lora: str | None, ids: Sequence[int]) -> bool:
        asked.append((m, lora, len(ids)))
        return held

    text = words(0, PARTIAL_ABOVE // 8 + 100)  # 8 characters a word: past the threshold
    req = inbound(text)
    whole = model.ids(req.body)
    tok = Tokenizer(5.0, lambda _m: ["http://engine"], local=local, holds=holds)
    try:
        got = await tok(req)
        assert got is not None
        ids = list(got.token_ids)
        assert len(asked) == 1 and asked[0][:2] == (MODEL, None)
        if held:  # an engine holds all of the start: the whole prompt, cached
            assert ids == whole and got.text_chars == len(text)
            assert await tok(inbound(text)) is not None and local.jobs == 1
        else:  # nobody holds all of the start: its ids are the prompt's first ids, exactly
            assert 0 < len(ids) == asked[0][2] < len(whole) // 3
            assert ids == whole[: len(ids)]
            assert got.text_chars is not None
            assert PARTIAL_CHARS // 2 < got.text_chars <= PARTIAL_CHARS
            assert await tok(inbound(text)) is not None and local.jobs == 2  # not cached
    finally:
        await tok.close()


async def test_local_tokenizer_what_it_cannot_render_falls_back(model: LocalTokenizer) -> None:
    outcomes: list[bool] = []
    local = Gated(model)
    precise = {MODEL: ["http://engine"]}
    tok = Tokenizer(
        5.0, lambda m: precise.get(m, []), lambda _s, ok: outcomes.append(ok), local=local
    )
    try:
        body = {"model": MODEL, "prompt": ["two", "prompts"]}
        assert await tok(parse(orjson.dumps(body), "/v1/completions")) is None
        other = parse(orjson.dumps({"model": "x", "prompt": "hi"}), "/v1/completions")
        assert await tok(other) is None  # no precise engine serves it: no job at all
    finally:
        await tok.close()
    assert outcomes == [False]
    assert local.jobs == 1


async def test_local_tokenizer_too_slow_routes_on_text_and_fills_the_cache_later(
    model: LocalTokenizer,
) -> None:
    outcomes: list[tuple[bool, bool]] = []
    local = Gated(model)
    local.gate = threading.Event()
    tok = Tokenizer(
        0.05,
        lambda _m: ["http://engine"],
        lambda s, ok: outcomes.append((s is not None, ok)),
        local=local,
    )
    try:
        req = chat(words(0, 20))
        first, second = await asyncio.gather(tok(req), tok(chat(words(0, 20))))
        assert first is None and second is None  # both waited on one job, past the timeout
        assert local.jobs == 1
        assert outcomes == [(False, False), (False, False)]  # two requests keyed on text
        local.gate.set()
        await settled(tok)
        got = await tok(chat(words(0, 20)))
        assert got is not None and list(got.token_ids) == model.ids(req.body)
        assert local.jobs == 1
        assert outcomes[2:] == [(True, True)]  # the job's own time, when it ended
    finally:
        local.gate.set()
        await tok.close()


async def test_local_tokenizer_busy_keys_on_text_without_queueing(
    model: LocalTokenizer,
) -> None:
    outcomes: list[tuple[float | None, bool]] = []
    local = Gated(model)
    local.gate = threading.Event()
    tok = Tokenizer(
        0.01, lambda _m: ["http://engine"], lambda s, ok: outcomes.append((s, ok)), local=local
    )
    try:
        for i in range(LOCAL_PENDING):
            assert await tok(chat(words(100 * i, 3))) is None
        assert tok.pending == LOCAL_PENDING
        outcomes.clear()  # each timed out (a failure without a time)
        assert await tok(chat(words(99_000, 3))) is None
        assert outcomes == [(None, False)]  # refused: no job, no time measured
    finally:
        local.gate.set()
        await settled(tok)
        await tok.close()
    assert local.jobs <= LOCAL_PENDING


async def agreement(
    local: LocalTokenizer | None, engine_tokenizer: LocalTokenizer | None
) -> bool | None:
    """``agrees`` of a client with ``local`` against an engine-sim with ``engine_tokenizer``."""
    settings = SimSettings(model=MODEL, fast=True, tokenizer=engine_tokenizer)
    async with serving(settings) as url:
        tok = Tokenizer(5.0, lambda _m: [url], local=local)
        try:
            return await tok.agrees(url, MODEL)
        finally:
            await tok.close()


async def test_local_tokenizer_check_against_the_engines_own(
    model: LocalTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = LocalTokenizer.load(
        write_tokenizer(tmp_path_factory.mktemp("other"), corpus=["another model entirely"] * 50)
    )
    plain = LocalTokenizer.load(write_tokenizer(tmp_path_factory.mktemp("plain"), template=None))
    assert await agreement(model, model) is True
    assert await agreement(plain, plain) is True  # no chat template: a plain prompt probes
    assert await agreement(other, model) is False
    assert await agreement(model, None) is False  # engine-sim's own 4-character pieces
    assert await agreement(None, model) is None  # nothing local to check
    async with engines(1, answer(None)) as (urls, _asked):  # an engine that cannot say
        tok = Tokenizer(5.0, lambda _m: urls, local=model)
        try:
            assert await tok.agrees(urls[0], MODEL) is None
        finally:
            await tok.close()
