"""A request's token ids, from an engine's own tokenizer (vLLM's ``POST /tokenize``) or a local one.

Precise routing keys a request over the ids the engine will see (the chat template applied),
so they come from the engine: ``{"model", "prompt"}`` or ``{"model", "messages",
"add_generation_prompt": true}`` answering ``{"tokens": [...], "count": N, ...}``. A call has a
short timeout, and any failure means ``None``: the request is routed on the router's text keys
instead. A prompt given as token ids needs no call.

What a call costs decides whether precise routing pays (bench/RESULTS.md, KV events live): a
conversation's next turn re-sends its whole history, the engine renders and tokenizes all of
it, and the router parses one id per token. So:

- answers are cached by routing text, as ``array('I')`` (4 bytes an id), bounded by the ids
  held; a repeated prompt costs nothing;
- a prompt that *extends* a cached one (the next turn of a conversation this router saw) is
  routed at once on the cached head's ids, less a margin at its end (a tokenizer may merge the
  last tokens with the text that follows, and a chat template's generation prompt need not
  recur): the engines can only hold more of it if the same continuation was sent before. The
  whole prompt is tokenized in the background, at most ``BACKGROUND_CALLS`` at a time, so the
  turn after it finds its head too;
- calls go round-robin over the precise engines serving the model (any of them tokenizes the
  same way), not all to one engine that also serves traffic;
- ids are checked and packed in C (``core.kv_events.token_array``), never one by one.

With a local tokenizer (``--tokenizer PATH``, router.local_tokenizer) there is no round
trip, but the encode itself is the cost: a prompt is tokenized on one of ``LOCAL_THREADS``
worker threads (the tokenizer releases the GIL), at most ``LOCAL_PENDING`` at a time, and
identical prompts in flight share one job. Cached heads work as above, the whole prompt then
being tokenized on a worker thread. A job still running at the timeout goes on and fills the
cache, and the request is keyed on its text.

A long prompt is encoded in two steps: its first ``PARTIAL_CHARS`` (cut before a space, less
``HEAD_MARGIN_IDS`` ids at the cut), then the whole only if some precise engine holds every
block of that start (``holds``). Most long prompts share a short prefix if any (a first turn,
a new document), and the ids of their tail would key nothing: their encode costs a quarter
or less. A prompt whose start is held costs its start twice. Only whole prompts are cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson

from router.core.blocks import CHARS_PER_TOKEN, RoutingText, block_keys
from router.core.kv_events import token_array
from router.core.precise import TokenPrompt
from router.gateway.openai.errors import UpstreamError
from router.gateway.openai.request import Inbound, parse
from router.gateway.upstream.client import HttpUpstream, Upstream
from router.local_tokenizer import LocalTokenizer

log = logging.getLogger(__name__)

# About 4 bytes per cached id, plus its text (about 4 bytes a token): tens of MB at most.
CACHE_TOKENS = 4_000_000
MAX_TOKENS = 1 << 20
# The JSON of MAX_TOKENS ids, about 8 bytes each, and the answer's other fields.
MAX_ANSWER_BYTES = 9 * MAX_TOKENS
# Heads are found by chained keys of this many characters of routing text: a prompt is
# looked up with one dict probe per chunk, deepest first.
HEAD_CHUNK_CHARS = 512
# Ids dropped from the end of a cached head before it stands for a longer prompt's start:
# more than a generation prompt and a merge at the seam; one engine block at most is lost.
HEAD_MARGIN_IDS = 16
# Whole prompts tokenized in the background after a head answered; beyond this, skipped.
BACKGROUND_CALLS = 4
# A local tokenizer's worker threads (a core each while they encode), and the prompts it may
# hold in flight: beyond that, a request is keyed on its text rather than queue for a thread.
LOCAL_THREADS = 2
LOCAL_PENDING = 64
# What ``agrees`` asks an engine and the local tokenizer to tokenize: a system prompt, some
# punctuation, digits, accents, a tab and a double space, where tokenizers differ.
PROBE_MESSAGES = (
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Hello!  What's 12,345 x 6?\tCafé, naïve, 東京."},
)
# ``check_loop`` looks for new precise engines this often, and asks one this many times.
CHECK_SECONDS = 5.0
CHECK_TRIES = 3
# Prompts longer than PARTIAL_ABOVE characters are encoded first up to PARTIAL_CHARS.
PARTIAL_ABOVE = 65_536
PARTIAL_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class _Ids:
    ids: array[int]
    share: float  # of the prompt's text the ids cover (1.0: all of it)


def _packed(ids: list[int]) -> array[int]:
    """Ids as ``array('I')``; raises ``ValueError`` when there are too many or one is bad."""
    got = token_array(ids) if len(ids) <= MAX_TOKENS else None
    if got is None:
        raise ValueError("more ids than a prompt may have, or one that is not a token id")
    return got


def lora_of(inbound: Inbound) -> str | None:
    adapter = inbound.body.get("lora_adapter", inbound.body.get("lora_path"))
    return adapter if isinstance(adapter, str) and adapter else None


@dataclass(frozen=True, slots=True)
class _Entry:
    ids: array[int]
    head_key: int | None  # the chained key of the text's last whole chunk (None: no chunk)


class Tokenizer:
    """Token ids of requests to the precise engines serving the model: from one of them, or
    from ``local``."""

    def __init__(
        self,
        timeout_seconds: float,
        engines: Callable[[str], Sequence[str]],
        observe: Callable[[float | None, bool], None] = lambda _s, _ok: None,
        upstream: Upstream | None = None,
        local: LocalTokenizer | None = None,
        holds: Callable[[str, str | None, Sequence[int]], bool] | None = None,
    ) -> None:
        self.timeout = timeout_seconds
        self.engines = engines  # model -> precise engines serving it
        self.observe = observe  # (seconds, or None for a call never made; succeeded)
        self._cache: OrderedDict[RoutingText, _Entry] = OrderedDict()
        # chained key of a cached text's last whole chunk -> the cached texts ending there
        self._heads: dict[int, list[RoutingText]] = {}
        self._held = 0
        self._turn = itertools.count()
        self._background: dict[RoutingText, asyncio.Task[None]] = {}
        # The gateway's own (engines' API keys included); else one of the tokenizer's own.
        self._owned = upstream is None
        self._upstream: Upstream = upstream or HttpUpstream(timeout_seconds)
        self._local = local
        self._threads = (
            ThreadPoolExecutor(LOCAL_THREADS, thread_name_prefix="tokenize") if local else None
        )
        self._jobs: dict[RoutingText, asyncio.Future[_Ids | None]] = {}
        # (model, LoRA adapter, ids) -> whether a precise engine holds every block of the ids;
        # None: every prompt is encoded whole.
        self._holds = holds

    async def close(self) -> None:
        """Stop background calls and close the client session."""
        tasks = list(self._background.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._background.clear()  # a task cancelled before it ran never removed itself
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._owned:
            await self._upstream.close()

    @property
    def pending(self) -> int:
        """Background tokenizations in flight."""
        return len(self._background) + len(self._jobs)

    async def __call__(self, inbound: Inbound) -> TokenPrompt | None:
        """The request's ids (or its head's), or None: no precise engine, or it could not say."""
        rt = inbound.text
        lora = lora_of(inbound)
        if rt.token_ids is not None:
            ids = rt.token_ids
            return TokenPrompt(ids, lora, len(ids) * CHARS_PER_TOKEN)
        engines = self.engines(inbound.model)
        text = rt.text or ""
        if not engines or not text:  # nothing to key (a count of tokens is routed on none)
            return None
        entry = self._cache.get(rt)
        if entry is not None:
            self._cache.move_to_end(rt)
            return TokenPrompt(entry.ids, lora, len(text))
        keys = block_keys(rt, HEAD_CHUNK_CHARS)
        head = self._head(rt, keys)
        if head is not None:
            self._in_background(inbound, keys, engines)
            ids, head_text = self._cache[head].ids, head.text or ""
            n = max(0, len(ids) - HEAD_MARGIN_IDS)
            chars = len(head_text) * n // len(ids) if ids else 0
            return TokenPrompt(ids[:n], lora, chars)
        if self._local is not None:
            done = await self._encode(self._local, inbound, keys)
            if done is None:
                return None
            return TokenPrompt(done.ids, lora, round(len(text) * done.share))
        got = await self._ask(self._next(engines), inbound)
        if got is None:
            return None
        self._remember(rt, got, keys)
        return TokenPrompt(got, lora, len(text))

    def _next(self, engines: Sequence[str]) -> str:
        return engines[next(self._turn) % len(engines)]

    def _head(self, rt: RoutingText, keys: Sequence[int]) -> RoutingText | None:
        """The longest cached text that ``rt``'s text starts with (never ``rt`` itself)."""
        text = rt.text or ""
        for k in reversed(keys):
            for cached in self._heads.get(k, ()):
                if cached.namespace == rt.namespace and text.startswith(cached.text or ""):
                    return cached
        return None

    def _in_background(self, inbound: Inbound, keys: Sequence[int], engines: Sequence[str]) -> None:
        rt = inbound.text
        if self._local is not None:
            self._job(self._local, inbound, keys, whole=True)  # a head for the next turn
            return
        if rt in self._background or len(self._background) >= BACKGROUND_CALLS:
            return
        engine = self._next(engines)

        async def fill() -> None:
            try:
                got = await self._ask(engine, inbound)
                if got is not None:
                    self._remember(rt, got, keys)
            finally:
                self._background.pop(rt, None)

        self._background[rt] = asyncio.create_task(fill(), name="tokenize")

    def _remember(self, rt: RoutingText, ids: array[int], keys: Sequence[int]) -> None:
        if rt in self._cache:
            return
        head_key = keys[-1] if keys else None
        self._cache[rt] = _Entry(ids, head_key)
        if head_key is not None:
            self._heads.setdefault(head_key, []).append(rt)
        self._held += len(ids)
        while self._held > CACHE_TOKENS and self._cache:
            old_rt, old = self._cache.popitem(last=False)
            self._held -= len(old.ids)
            if old.head_key is not None:
                same = self._heads[old.head_key]
                same.remove(old_rt)
                if not same:
                    del self._heads[old.head_key]

    def _job(
        self, local: LocalTokenizer, inbound: Inbound, keys: Sequence[int], whole: bool = False
    ) -> asyncio.Future[_Ids | None] | None:
        """The local tokenization of this prompt in flight, started if need be; None: no room."""
        rt = inbound.text
        job = self._jobs.get(rt)
        if job is None and len(self._jobs) < LOCAL_PENDING:
            job = asyncio.ensure_future(self._run_local(local, inbound, keys, whole))
            self._jobs[rt] = job
            job.add_done_callback(lambda _j: self._jobs.pop(rt, None))
        return job

    async def _encode(
        self, local: LocalTokenizer, inbound: Inbound, keys: Sequence[int]
    ) -> _Ids | None:
        """The prompt's ids from the local tokenizer, or None (cannot render, busy, too slow)."""
        job = self._job(local, inbound, keys)
        if job is None:
            self.observe(None, False)
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.timeout)
        except TimeoutError:
            # Keyed on its text: a failure for this request. The job goes on (its time is
            # measured when it ends), and the next request for this prompt finds its ids.
            self.observe(None, False)
            return None

    async def _run_local(
        self, local: LocalTokenizer, inbound: Inbound, keys: Sequence[int], whole: bool
    ) -> _Ids | None:
        assert self._threads is not None
        threads, loop = self._threads, asyncio.get_running_loop()
        t = time.perf_counter()
        try:
            body = inbound.prompt_body
            text, special = await loop.run_in_executor(threads, local.text_of, body)
            if not whole and self._holds is not None and len(text) > PARTIAL_ABOVE:
                # Before a space: the words up to it encode as they do in the whole text.
                space = text.rfind(" ", PARTIAL_CHARS // 2, PARTIAL_CHARS)
                cut = space if space > 0 else PARTIAL_CHARS
                start = await loop.run_in_executor(threads, local.encode, text[:cut], special)
                n = max(0, len(start) - HEAD_MARGIN_IDS)
                head = _packed(start[:n])
                if not self._holds(inbound.model, lora_of(inbound), head):
                    self.observe(time.perf_counter() - t, True)
                    return _Ids(head, cut * n / len(start) / len(text) if start else 0.0)
            ids = _packed(await loop.run_in_executor(threads, local.encode, text, special))
        except ValueError as e:
            log.debug("local tokenization failed: %s", e)
            self.observe(time.perf_counter() - t, False)
            return None
        self.observe(time.perf_counter() - t, True)
        self._remember(inbound.text, ids, keys)
        return _Ids(ids, 1.0)

    async def agrees(self, engine: str, model: str) -> bool | None:
        """Whether the local tokenizer gives ``engine``'s ``/tokenize`` ids for a probe prompt.

        None: there is no local tokenizer, or the engine could not say (no such route, down).
        Wrong files are otherwise silent: no request's keys would match the engine's events.
        """
        local = self._local
        if local is None:
            return None
        if local.has_chat_template:
            body: dict[str, object] = {"model": model, "messages": PROBE_MESSAGES}
        else:
            body = {"model": model, "prompt": PROBE_MESSAGES[-1]["content"]}
        route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        inbound = parse(orjson.dumps(body), route)
        try:
            theirs = await self._fetch(engine, inbound)
        except (UpstreamError, ValueError) as e:
            log.debug("no tokenizer check on %s: %s", engine, e)
            return None
        try:
            ours = await asyncio.get_running_loop().run_in_executor(
                self._threads, local.ids, inbound.body
            )
        except ValueError:
            return False  # the engine renders the probe, the local template cannot
        return list(theirs) == ours

    async def check_loop(self, engines: Callable[[], Sequence[tuple[str, str]]]) -> None:
        """Run ``agrees`` once on each of ``engines()`` (URL, a model it serves) as they come,
        and warn of each that disagrees; one that cannot say is given up after a few tries."""
        done: set[str] = set()
        tries: dict[str, int] = {}
        while True:
            for url, model in engines():
                if url in done:
                    continue
                agrees = await self.agrees(url, model)
                tries[url] = tries.get(url, 0) + 1
                if agrees is False:
                    log.warning(
                        "the local tokenizer and %s's POST /tokenize give different ids for the "
                        "same prompt: no request will match its KV events. Is --tokenizer the "
                        "served model's?",
                        url,
                    )
                if agrees is not None or tries[url] >= CHECK_TRIES:
                    done.add(url)
            await asyncio.sleep(CHECK_SECONDS)

    async def _ask(self, engine: str, inbound: Inbound) -> array[int] | None:
        t = time.perf_counter()
        try:
            ids = await self._fetch(engine, inbound)
        except (UpstreamError, ValueError) as e:  # orjson's decode error is a ValueError
            log.debug("tokenize on %s failed: %s", engine, e)
            self.observe(time.perf_counter() - t, False)
            return None
        self.observe(time.perf_counter() - t, True)
        return ids

    async def _fetch(self, engine: str, inbound: Inbound) -> array[int]:
        """``engine``'s ids for the prompt; raises ``UpstreamError`` or ``ValueError``."""
        body = inbound.prompt_body  # Responses and Messages bodies in their chat form
        req: dict[str, object] = {"model": inbound.model}
        if "messages" in body:
            req["messages"] = body["messages"]
            req["add_generation_prompt"] = True
            if body.get("tools"):
                req["tools"] = body["tools"]
        else:
            req["prompt"] = body.get("prompt", body.get("input"))
        status, raw = await self._upstream.fetch(
            engine, "/tokenize", self.timeout, orjson.dumps(req), MAX_ANSWER_BYTES
        )
        if status != 200:
            raise ValueError(f"status {status}")
        got = orjson.loads(raw)
        tokens = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(tokens, list):
            raise ValueError("no 'tokens' array")
        return _packed(tokens)
