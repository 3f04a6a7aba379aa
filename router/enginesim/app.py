"""``kvrouter engine-sim``: a simulated OpenAI-compatible engine with a real prefix cache.

One process is one engine. It answers the OpenAI surface the gateway proxies, framed like vLLM's
OpenAI server, and exports vLLM's metric names, so the gateway, the demo and the benchmarks can
treat it as a real engine. Behind the HTTP surface is the engine model the offline simulator
uses (``router.core.engine_model``): a result in simulation is one the live demo can reproduce.

- Tokens are the whitespace-separated words of the request's routing text (the canonical text
  the router hashes, from ``router.core.blocks.routing_text``), or the ids of a token-id prompt.
  Full blocks of ``--block-tokens`` tokens get chained keys seeded by the model namespace and
  live in an LRU prefix cache of ``--kv-capacity-tokens``; ``usage`` reports the cached tokens.
- Timing: ``EngineClock.admit`` gives each request its schedule when it arrives. Stream headers
  go out at once (as vLLM's do); the first token is sent at the schedule's first-token time and
  the rest one decode step apart. ``--fast`` drops every delay; the cache and stats still work.
- Output is ``max_completion_tokens`` / ``max_tokens`` deterministic words (default 16, capped).

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings; GET /v1/models,
/health, /metrics (vLLM gauges and counters labelled ``model_name``), /stats (JSON counters);
POST /reset (empty the cache, the clock and the counters).

Test hook, fault injection for the gateway's tests (unauthenticated: never expose engine-sim to
untrusted clients). A fault applies to the next ``count`` (default 1) generation requests
(chat, completions, embeddings), taken when a request arrives, before its body is read; setting
a fault replaces the pending one.

    POST /fault {"mode": "status", "status": 503, "count": N}
        answer ``status`` (400-599) in OpenAI's error shape, before any other byte
    POST /fault {"mode": "hang", "count": N}
        accept the request and send nothing until the client gives up (a 504 after HANG_LIMIT_S)
    POST /fault {"mode": "drop-mid-stream", "count": N}
        serve normally, then abort the connection after the first two tokens (a non-streamed
        answer is cut after half its body)
    POST /fault {"mode": "clear"}
        drop the pending fault
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import enum
import itertools
import logging
import math
import signal
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
import xxhash
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.core.blocks import RequestShapeError, RoutingText, chain_keys, namespace_seed
from router.core.blocks import routing_text as canonical_routing_text
from router.core.engine_model import EngineClock, EngineSpec, PrefixCache, Schedule
from router.gateway import sse
from router.gateway.eventloop import loop_factory

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_MODEL = "sim-model"
DEFAULT_MAX_TOKENS = 16
# Far above any benchmark's output length, low enough that one request cannot pin the engine.
MAX_TOKENS_CAP = 4096
MAX_CHOICES = 16
# Long-context prompts (100k+ tokens of JSON) must fit; anything larger is a client bug.
MAX_BODY_BYTES = 64 * 1024 * 1024
# A hung request gives up by itself eventually, so a forgotten client cannot pin it forever.
HANG_LIMIT_S = 300.0
DROP_AFTER_TOKENS = 2
EMBEDDING_DIM = 16
# In-flight streams get this long to finish on SIGTERM before they are cancelled.
SHUTDOWN_GRACE_S = 2.0

# Output vocabulary: plain words, so generated text re-tokenises to the same count.
_WORDS = (  # noqa: SIM905 - one sentence reads better than 31 quoted words
    "the quick brown fox jumps over a lazy dog while seven bright stars watch from far above "
    "and every small river runs toward one quiet sea under an old silver moon"
).split()

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimSettings:
    """What one simulated engine serves and how fast."""

    model: str = DEFAULT_MODEL
    spec: EngineSpec = field(default_factory=EngineSpec)
    fast: bool = False


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Settings from parsed ``engine-sim`` arguments; raises ``ValueError`` on a bad spec."""
    spec = EngineSpec(
        capacity_tokens=args.kv_capacity_tokens,
        block_tokens=args.block_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s,
        max_batch=args.max_batch,
    )
    return SimSettings(model=args.model, spec=spec, fast=args.fast)


# -- errors --------------------------------------------------------------------------------


class ApiError(Exception):
    """A refused request: the HTTP status and the OpenAI error fields it answers with."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def _error_type(status: int) -> str:
    # vLLM names the type after the exception class: "BadRequestError", "NotFoundError", ...
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = "".join(w.capitalize() for w in phrase.replace("-", " ").split())
    return name if name.endswith("Error") else name + "Error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, typed and coded the way vLLM does it."""
    return {
        "error": {"message": message, "type": _error_type(status), "param": param, "code": status}
    }


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """An OpenAI-shaped JSON error response."""
    return _json(error_body(status, message, param), status=status)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


_HTTP_MESSAGES: dict[int, str] = {
    404: "no route for {method} {path}",
    405: "method {method} is not allowed on {path}",
    413: "request body is larger than {limit} bytes",
}


@web.middleware
async def _errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every refusal and failure leaves as an OpenAI error object, never as a stack trace."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        template = _HTTP_MESSAGES.get(exc.status, exc.reason)
        message = template.format(method=request.method, path=request.path, limit=MAX_BODY_BYTES)
        resp = error_response(exc.status, message)
        if "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal error in engine-sim")


# -- requests ------------------------------------------------------------------------------


class Endpoint(enum.Enum):
    """The two generation endpoints; they differ in field names and response objects."""

    CHAT = "chat"
    COMPLETIONS = "completions"


@dataclass(frozen=True, slots=True)
class Generation:
    """A validated generation request, reduced to what the engine model needs."""

    endpoint: Endpoint
    stream: bool
    include_usage: bool
    max_tokens: int
    finish_reason: str
    choices: int
    prompt_tokens: int
    keys: tuple[int, ...]
    seed: int


def _opt_bool(body: Mapping[str, Any], name: str, where: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{where}{name}' must be a boolean", where + name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(
    body: Mapping[str, Any], name: str, default: int, lo: int, hi: int, *, clamp: bool = False
) -> int:
    """An integer field in [lo, hi]; with ``clamp``, values above ``hi`` become ``hi``."""
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise ApiError(400, f"'{name}' must be an integer", name)
    if value < lo:
        raise ApiError(400, f"'{name}' must be at least {lo}, got {value}", name)
    if value > hi and not clamp:
        raise ApiError(400, f"'{name}' must be at most {hi}, got {value}", name)
    return min(int(value), hi)


def _check_model(body: Any, served: str) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a non-empty string", "model")
    if model != served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    return body


def _routing_text(body: Mapping[str, Any]) -> RoutingText:
    try:
        return canonical_routing_text(body)
    except RequestShapeError as exc:
        raise ApiError(400, str(exc), exc.param) from exc


def prompt_tokens(rt: RoutingText) -> list[str]:
    """The engine's tokens for a prompt: its words, or its token ids as given."""
    if rt.token_ids is not None:
        return [str(t) for t in rt.token_ids]
    return (rt.text or "").split()


def prefix_keys(namespace: str, tokens: Sequence[str], block_tokens: int) -> list[int]:
    """Chained keys of the full ``block_tokens``-token blocks of ``tokens``."""
    full = len(tokens) - len(tokens) % block_tokens
    blocks = (
        " ".join(tokens[i : i + block_tokens]).encode("utf-8", "surrogatepass")
        for i in range(0, full, block_tokens)
    )
    return chain_keys(blocks, namespace_seed(namespace))


def _batch_size(prompt: Any) -> int:
    # A list of prompts is a batch: one choice per prompt, as OpenAI's completions API does.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def parse_generation(body: Any, endpoint: Endpoint, settings: SimSettings) -> Generation:
    """Validate a chat or completions body; raises ``ApiError`` with the field at fault."""
    body = _check_model(body, settings.model)
    required = "messages" if endpoint is Endpoint.CHAT else "prompt"
    if required not in body:
        raise ApiError(400, f"'{required}' is required", required)
    rt = _routing_text(body)
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    if options is not None and not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", "stream")
    include_usage = _opt_bool(options or {}, "include_usage", "stream_options.")
    name = "max_tokens"
    if endpoint is Endpoint.CHAT and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"
    max_tokens = _opt_int(body, name, DEFAULT_MAX_TOKENS, 1, MAX_TOKENS_CAP, clamp=True)
    n = _opt_int(body, "n", 1, 1, MAX_CHOICES)
    batch = _batch_size(body.get("prompt")) if endpoint is Endpoint.COMPLETIONS else 1
    tokens = prompt_tokens(rt)
    keys = prefix_keys(rt.namespace, tokens, settings.spec.block_tokens)
    return Generation(
        endpoint=endpoint,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        # A request that set no limit ends "naturally"; one that did runs into it.
        finish_reason="stop" if body.get(name) is None else "length",
        choices=n * batch,
        prompt_tokens=len(tokens),
        keys=tuple(keys),
        seed=keys[-1] if keys else len(tokens),
    )


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """A validated embeddings request: its inputs as text, and how to encode the vectors."""

    inputs: tuple[str, ...]
    prompt_tokens: int
    base64: bool


def _embedding_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(_is_int(v) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise ApiError(
        400,
        "'input' must be a string, an array of strings, an array of token ids "
        "or an array of token-id arrays",
        "input",
    )


def parse_embedding(body: Any, settings: SimSettings) -> EmbeddingRequest:
    """Validate an embeddings body; raises ``ApiError`` with the field at fault."""
    body = _check_model(body, settings.model)
    if "input" not in body:
        raise ApiError(400, "'input' is required", "input")
    inputs = _embedding_inputs(body["input"])
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    tokens = sum(len(text.split()) for text in inputs)
    return EmbeddingRequest(tuple(inputs), tokens, fmt == "base64")


def embedding(text: str) -> list[float]:
    """A deterministic unit vector of ``EMBEDDING_DIM`` floats for ``text``."""
    data = text.encode("utf-8", "surrogatepass")
    raw = [xxhash.xxh3_64_intdigest(data, seed) / 2**63 - 1.0 for seed in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


# -- engine state --------------------------------------------------------------------------


@dataclass(slots=True)
class Counters:
    """Totals since start or the last reset."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class Ticket:
    """One admitted request: its schedule, its cache hit, and how many tokens it has sent."""

    rid: int
    cached: int
    schedule: Schedule
    emitted: int = 0


@dataclass(frozen=True, slots=True)
class Fault:
    """A pending injected fault: what happens to the next ``count`` generation requests."""

    mode: str
    count: int
    status: int = 503


FAULT_MODES = ("status", "hang", "drop-mid-stream")


class Engine:
    """The engine's mutable state: prefix cache, clock, counters, in-flight requests, fault."""

    def __init__(self, settings: SimSettings, now: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.now = now
        self.cache = PrefixCache(settings.spec.capacity_tokens, settings.spec.block_tokens)
        self.clock = EngineClock(settings.spec)
        self.counters = Counters()
        self.fault: Fault | None = None
        self.started = int(time.time())
        self._inflight: dict[int, Schedule] = {}
        self._ids = itertools.count()

    def admit(self, keys: Sequence[int], prompt_tokens: int, output_tokens: int) -> Ticket:
        """Look the prompt up in the cache (then cache it), schedule it, count it."""
        now = self.now()
        cached = self.cache.lookup_and_insert(keys, prompt_tokens, now)
        if self.settings.fast:
            schedule = Schedule(now, now, now, now)
        else:
            schedule = self.clock.admit(now, prompt_tokens - cached, output_tokens)
        c = self.counters
        c.requests += 1
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += cached
        ticket = Ticket(next(self._ids), cached, schedule)
        self._inflight[ticket.rid] = schedule
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Forget a finished, failed or abandoned request; count the tokens it did send."""
        # The clock keeps an abandoned request's slot until its planned end (it has no abort),
        # but the running and waiting gauges follow the requests actually in flight.
        if self._inflight.pop(ticket.rid, None) is not None:
            self.counters.completion_tokens += ticket.emitted

    def load(self) -> tuple[int, int]:
        """In-flight requests as (running, waiting): waiting ones have not begun prefill."""
        now = self.now()
        waiting = sum(1 for s in self._inflight.values() if s.prefill_start > now)
        return len(self._inflight) - waiting, waiting

    def take_fault(self) -> Fault | None:
        """The fault for the request arriving now, if one is pending; uses up one count."""
        fault = self.fault
        if fault is None:
            return None
        self.fault = Fault(fault.mode, fault.count - 1, fault.status) if fault.count > 1 else None
        return fault

    def reset(self) -> None:
        """Empty the cache, the clock and the counters (in-flight requests run on)."""
        self.cache.clear()
        self.clock.reset()
        self.counters = Counters()

    def stats(self) -> dict[str, Any]:
        """Counters and gauges as JSON-ready values."""
        c = self.counters
        running, waiting = self.load()
        spec = self.settings.spec
        return {
            "model": self.settings.model,
            "requests": c.requests,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "completion_tokens": c.completion_tokens,
            "cache_hit_ratio": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "running": running,
            "waiting": waiting,
            "cache_tokens": self.cache.tokens,
            "cache_capacity_tokens": spec.capacity_tokens,
            "block_tokens": spec.block_tokens,
            "fast": self.settings.fast,
        }


class _EngineCollector(Collector):
    """vLLM's metric names, read from the engine at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        e = self._engine
        running, waiting = e.load()
        usage = min(1.0, e.cache.tokens / e.settings.spec.capacity_tokens)
        c = e.counters
        gauges = (
            ("vllm:num_requests_running", "Requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage (older vLLM name).", usage),
        )
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", c.prompt_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", c.cached_tokens),
            ("vllm:prompt_tokens", "Prefill tokens processed.", c.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens processed.", c.completion_tokens),
            ("vllm:request_success", "Requests admitted.", c.requests),
        )
        labels = ["model_name"]
        model = [e.settings.model]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(model, value)
            yield g
        for name, doc, value in counters:
            m = CounterMetricFamily(name, doc, labels=labels)
            m.add_metric(model, value)
            yield m


ENGINE = web.AppKey("engine", Engine)
REGISTRY = web.AppKey("registry", CollectorRegistry)


# -- responses -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """One response's identity and text; renders its stream chunks and its full body."""

    gen: Generation
    model: str
    cached: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def _chat(self) -> bool:
        return self.gen.endpoint is Endpoint.CHAT

    def word(self, i: int, choice: int) -> str:
        """Output token ``i`` of ``choice``: a word, space-led after the first."""
        w = _WORDS[(self.gen.seed + 7 * i + 11 * choice) % len(_WORDS)]
        return w if i == 0 else " " + w

    def text(self, choice: int) -> str:
        return "".join(self.word(i, choice) for i in range(self.gen.max_tokens))

    def usage(self) -> dict[str, Any]:
        completion = self.gen.max_tokens * self.gen.choices
        return {
            "prompt_tokens": self.gen.prompt_tokens,
            "total_tokens": self.gen.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        prefix = "chatcmpl-" if self._chat else "cmpl-"
        chunk = {
            "id": prefix + self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        return sse.encode(orjson.dumps(chunk))

    def _choice(self, c: int, text: str, finish: str | None) -> dict[str, Any]:
        if self._chat:
            delta = {"content": text} if finish is None else {}
            return {"index": c, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "index": c,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }

    def head(self) -> bytes:
        """What precedes the first token: the assistant role, for chat."""
        if not self._chat:
            return b""
        return b"".join(
            self._event(
                [
                    {
                        "index": c,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for c in range(self.gen.choices)
        )

    def tokens(self, start: int, stop: int) -> bytes:
        """Events for output tokens ``start`` to ``stop`` of every choice."""
        return b"".join(
            self._event([self._choice(c, self.word(i, c), None)])
            for i in range(start, stop)
            for c in range(self.gen.choices)
        )

    def tail(self) -> bytes:
        """The finish events, the usage event when asked for, and ``[DONE]``."""
        parts = [
            self._event([self._choice(c, "", self.gen.finish_reason)])
            for c in range(self.gen.choices)
        ]
        if self.gen.include_usage:
            parts.append(self._event([], usage=self.usage()))
        parts.append(sse.DONE)
        return b"".join(parts)

    def full(self) -> bytes:
        """The non-streamed response body."""
        choices: list[dict[str, Any]] = []
        for c in range(self.gen.choices):
            choice: dict[str, Any] = {"index": c}
            if self._chat:
                choice["message"] = {"role": "assistant", "content": self.text(c), "tool_calls": []}
            else:
                choice["text"] = self.text(c)
            choice.update(logprobs=None, finish_reason=self.gen.finish_reason, stop_reason=None)
            choices.append(choice)
        return orjson.dumps(
            {
                "id": ("chatcmpl-" if self._chat else "cmpl-") + self.id,
                "object": "chat.completion" if self._chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
            }
        )


# -- handlers ------------------------------------------------------------------------------


async def _sleep_until(engine: Engine, when: float) -> None:
    delay = when - engine.now()
    if delay > 0:
        await asyncio.sleep(delay)


def _abort(request: web.Request) -> None:
    # Reset the connection without a proper end: what a crashed engine looks like to a proxy.
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc


async def _take_fault(request: web.Request) -> bool:
    """Play the pending fault, if any; True when this request must drop mid-stream."""
    fault = request.app[ENGINE].take_fault()
    if fault is None:
        return False
    if fault.mode == "status":
        raise ApiError(fault.status, f"injected fault: status {fault.status}")
    if fault.mode == "hang":
        await asyncio.sleep(HANG_LIMIT_S)
        raise ApiError(504, f"injected fault: hung for {HANG_LIMIT_S:g} s")
    return True


async def _stream(
    request: web.Request, engine: Engine, reply: Reply, ticket: Ticket, drop: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    gen, sched = reply.gen, ticket.schedule
    rate = engine.settings.spec.decode_tokens_per_s
    fast = engine.settings.fast
    sent = 0
    try:
        while sent < gen.max_tokens:
            due = gen.max_tokens
            if not fast:
                await _sleep_until(engine, sched.first_token + sent / rate)
                # Tokens that fell due while this task waited go out in one write.
                due = math.floor((engine.now() - sched.first_token) * rate) + 1
            if drop:
                due = sent + 1
            due = max(sent + 1, min(due, gen.max_tokens))
            head = reply.head() if sent == 0 else b""
            await resp.write(head + reply.tokens(sent, due))
            ticket.emitted = due * gen.choices
            sent = due
            if drop and sent >= DROP_AFTER_TOKENS:
                break
        if drop:
            _abort(request)
            return resp
        if not fast:
            await _sleep_until(engine, sched.done)
        await resp.write(reply.tail())
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left; the caller releases the request
    except Exception:
        log.exception("stream failed on %s", request.path)
        # Headers are gone already: end the stream the way OpenAI servers report errors in it.
        with contextlib.suppress(ConnectionError):
            await resp.write(sse.error_event("internal error in engine-sim", code=500))
    return resp


async def _json_answer(request: web.Request, body: bytes, drop: bool) -> web.StreamResponse:
    if not drop:
        return web.Response(body=body, content_type="application/json")
    # Promise the whole body, send half, vanish: a client must see a truncated payload.
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.content_length = len(body)
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    _abort(request)
    return resp


async def _answer(
    request: web.Request, engine: Engine, reply: Reply, ticket: Ticket, drop: bool
) -> web.StreamResponse:
    if not engine.settings.fast:
        await _sleep_until(engine, ticket.schedule.done)
    ticket.emitted = reply.gen.max_tokens * reply.gen.choices
    return await _json_answer(request, reply.full(), drop)


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    engine = request.app[ENGINE]
    drop = await _take_fault(request)
    gen = parse_generation(await _read_json(request), endpoint, engine.settings)
    ticket = engine.admit(gen.keys, gen.prompt_tokens, gen.max_tokens)
    try:
        reply = Reply(gen, engine.settings.model, ticket.cached)
        if gen.stream:
            return await _stream(request, engine, reply, ticket, drop)
        return await _answer(request, engine, reply, ticket, drop)
    finally:
        engine.release(ticket)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generate(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generate(request, Endpoint.COMPLETIONS)


def embeddings_body(req: EmbeddingRequest, model: str) -> bytes:
    """The embeddings response: one vector per input, as floats or base64 float32."""
    data = []
    for i, text in enumerate(req.inputs):
        vector = embedding(text)
        value: Any = vector
        if req.base64:
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    usage = {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    return orjson.dumps(
        {
            "id": "embd-" + uuid.uuid4().hex,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage,
        }
    )


async def embeddings(request: web.Request) -> web.StreamResponse:
    """POST /v1/embeddings: one deterministic unit vector per input."""
    engine = request.app[ENGINE]
    drop = await _take_fault(request)
    req = parse_embedding(await _read_json(request), engine.settings)
    # Embeddings pay prefill like any prompt but neither read nor fill the prefix cache.
    ticket = engine.admit((), req.prompt_tokens, 0)
    try:
        if not engine.settings.fast:
            await _sleep_until(engine, ticket.schedule.done)
        return await _json_answer(request, embeddings_body(req, engine.settings.model), drop)
    finally:
        engine.release(ticket)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one served model, in OpenAI's list shape."""
    engine = request.app[ENGINE]
    model = engine.settings.model
    card = {
        "id": model,
        "object": "model",
        "created": engine.started,
        "owned_by": "kvrouter",
        "root": model,
        "parent": None,
    }
    return _json({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 while the process serves."""
    return web.Response()


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text from the app's own registry."""
    return web.Response(
        body=generate_latest(request.app[REGISTRY]),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def stats(request: web.Request) -> web.Response:
    """GET /stats: the engine's counters as JSON."""
    return _json(request.app[ENGINE].stats())


async def reset(request: web.Request) -> web.Response:
    """POST /reset: empty the cache, the clock and the counters; answer the fresh stats."""
    engine = request.app[ENGINE]
    engine.reset()
    return _json(engine.stats())


def parse_fault(body: Any) -> Fault | None:
    """A ``/fault`` body -> the fault to arm (None for ``clear``); raises ``ApiError``."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    mode = body.get("mode")
    if mode == "clear":
        return None
    if mode not in FAULT_MODES:
        modes = ", ".join([*FAULT_MODES, "clear"])
        raise ApiError(400, f"'mode' must be one of {modes}; got {mode!r}", "mode")
    count = _opt_int(body, "count", 1, 1, sys.maxsize)
    if mode != "status":
        return Fault(mode, count)
    status = body.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ApiError(400, "'status' must be an integer from 400 to 599", "status")
    return Fault(mode, count, status)


async def fault(request: web.Request) -> web.Response:
    """POST /fault: arm or clear an injected fault (a test hook, see the module docstring)."""
    engine = request.app[ENGINE]
    engine.fault = parse_fault(await _read_json(request))
    f = engine.fault
    armed: dict[str, Any] | None = None
    if f is not None:
        armed = {"mode": f.mode, "count": f.count}
        if f.mode == "status":
            armed["status"] = f.status
    return _json({"fault": armed})


# -- app and process -----------------------------------------------------------------------


def build_app(settings: SimSettings) -> web.Application:
    """The engine as an aiohttp application (serve it with ``serving`` or an AppRunner)."""
    app = web.Application(middlewares=[_errors_middleware], client_max_size=MAX_BODY_BYTES)
    engine = Engine(settings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(engine))
    app[ENGINE] = engine
    app[REGISTRY] = registry
    app.add_routes(
        [
            web.post("/v1/chat/completions", chat_completions),
            web.post("/v1/completions", completions),
            web.post("/v1/embeddings", embeddings),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", metrics),
            web.get("/stats", stats),
            web.post("/reset", reset),
            web.post("/fault", fault),
        ]
    )
    return app


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@asynccontextmanager
async def serving(settings: SimSettings, host: str = LOOPBACK, port: int = 0) -> AsyncIterator[str]:
    """Serve an engine on ``host:port`` (0: a free port) while the block runs; yield its URL."""
    # A client that disconnects must cancel its handler, so generation stops with it.
    runner = web.AppRunner(
        build_app(settings),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if port == 0 else port
        yield _base_url(host, bound)
    finally:
        await runner.cleanup()


def _positive(kind: Callable[[str], int | float]) -> Callable[[str], Any]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``engine-sim`` options; defaults come from ``EngineSpec``."""
    d = EngineSpec()
    add = parser.add_argument
    add(
        "--port",
        type=int,
        required=True,
        metavar="P",
        help="TCP port to listen on (0: any free port)",
    )
    add("--host", default=LOOPBACK, metavar="H", help="address to listen on (default: %(default)s)")
    add(
        "--model",
        default=DEFAULT_MODEL,
        metavar="NAME",
        help="served model name (default: %(default)s)",
    )
    add(
        "--kv-capacity-tokens",
        type=_positive(int),
        default=d.capacity_tokens,
        metavar="N",
        help="prefix-cache capacity in tokens (default: %(default)s)",
    )
    add(
        "--block-tokens",
        type=_positive(int),
        default=d.block_tokens,
        metavar="N",
        help="tokens per cache block (default: %(default)s)",
    )
    add(
        "--prefill-tokens-per-s",
        type=_positive(float),
        default=d.prefill_tokens_per_s,
        metavar="X",
        help="prefill speed (default: %(default)s)",
    )
    add(
        "--decode-tokens-per-s",
        type=_positive(float),
        default=d.decode_tokens_per_s,
        metavar="Y",
        help="decode speed per sequence (default: %(default)s)",
    )
    add(
        "--max-batch",
        type=_positive(int),
        default=d.max_batch,
        metavar="B",
        help="requests decoded at once (default: %(default)s)",
    )
    add("--fast", action="store_true", help="no delays; the cache and stats still work")


async def _serve_until_signalled(settings: SimSettings, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(settings, host, port) as url:
        print(f"engine-sim: model {settings.model} on {url}", flush=True)
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    """Serve one simulated engine until SIGINT or SIGTERM."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"kvrouter engine-sim: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(_serve_until_signalled(settings, args.host, args.port))
    except OSError as exc:
        print(
            f"kvrouter engine-sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    return 0
