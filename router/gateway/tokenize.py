"""A request's token ids from an engine's own tokenizer (vLLM's ``POST /tokenize``).

Precise routing keys a request over the ids the engine will see (the chat template applied),
so they come from the engine: ``{"model", "prompt"}`` or ``{"model", "messages",
"add_generation_prompt": true}`` answering ``{"tokens": [...], "count": N, ...}``. Answers are
cached by routing text (bounded by the tokens held), a call has a short timeout, and any
failure means ``None``: the request is routed on the router's text keys instead. A prompt
given as token ids needs no call.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import aiohttp
import orjson

from router.core.blocks import RoutingText
from router.core.decision import TokenPrompt
from router.gateway.inbound import Inbound

log = logging.getLogger(__name__)

# About 4 bytes per cached id in an array, plus the text key: tens of MB at most.
CACHE_TOKENS = 4_000_000
MAX_TOKENS = 1 << 20


def lora_of(inbound: Inbound) -> str | None:
    adapter = inbound.body.get("lora_adapter", inbound.body.get("lora_path"))
    return adapter if isinstance(adapter, str) and adapter else None


class Tokenizer:
    """Token ids of requests, from one of the precise engines serving the model."""

    def __init__(
        self,
        timeout_seconds: float,
        engines: Callable[[str], Sequence[str]],
        observe: Callable[[float, bool], None] = lambda _s, _ok: None,
    ) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.engines = engines  # model -> precise engines serving it
        self.observe = observe  # (seconds, succeeded)
        self._cache: OrderedDict[RoutingText, tuple[int, ...]] = OrderedDict()
        self._held = 0
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def _remember(self, rt: RoutingText, ids: tuple[int, ...]) -> None:
        self._cache[rt] = ids
        self._held += len(ids)
        while self._held > CACHE_TOKENS and self._cache:
            _, old = self._cache.popitem(last=False)
            self._held -= len(old)

    async def __call__(self, inbound: Inbound) -> TokenPrompt | None:
        """The request's ids, or None (no precise engine, or the engine could not say)."""
        rt = inbound.text
        if rt.token_ids is not None:
            return TokenPrompt(tuple(rt.token_ids), lora_of(inbound))
        engines = self.engines(inbound.model)
        if not engines:
            return None
        ids = self._cache.get(rt)
        if ids is not None:
            self._cache.move_to_end(rt)
            return TokenPrompt(ids, lora_of(inbound))
        ids = await self._ask(engines[0], inbound)
        if ids is None:
            return None
        self._remember(rt, ids)
        return TokenPrompt(ids, lora_of(inbound))

    async def _ask(self, engine: str, inbound: Inbound) -> tuple[int, ...] | None:
        body = inbound.body
        req: dict[str, object] = {"model": inbound.model}
        if "messages" in body:
            req["messages"] = body["messages"]
            req["add_generation_prompt"] = True
            if body.get("tools"):
                req["tools"] = body["tools"]
        else:
            req["prompt"] = body.get("prompt", body.get("input"))
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self.timeout)
        t = time.perf_counter()
        try:
            async with self._http.post(
                engine + "/tokenize", data=orjson.dumps(req),
                headers={"Content-Type": "application/json"},
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                got = orjson.loads(await resp.read())
            tokens = got.get("tokens") if isinstance(got, dict) else None
            if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS:
                raise ValueError("no 'tokens' array")
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in tokens):
                raise ValueError("'tokens' holds a non-integer")
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.debug("tokenize on %s failed: %s", engine, e)
            self.observe(time.perf_counter() - t, False)
            return None
        self.observe(time.perf_counter() - t, True)
        return tuple(tokens)
