"""engine-sim's HTTP surface: the aiohttp app, its routes, and the pace of its answers.

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses (OpenAI's
Responses API, ``previous_response_id`` included: ``router.enginesim.stored``), /v1/messages
and /v1/messages/count_tokens (Anthropic's Messages API); GET /v1/models,
/health, /metrics (vLLM's names, ``router.enginesim.metrics``), /stats (JSON counters, and
the ``traceparents`` the latest generation requests carried);
POST /reset (empty the cache, the clock and the counters); POST /fault (below); POST /tokenize
(vLLM's shape: ``{"model", "prompt"}`` or ``{"model", "messages", ...}`` answers
``{"tokens": [...], "count": N, "max_model_len": M}``, the ids of ``tokens.token_ids``);
POST /abort_request (SGLang's: ``{"rid": ...}`` or ``{"abort_all": true}``; what a closed
connection and an abort stop is ``router.enginesim.cancel``'s); POST /kv/pull (a decode engine
reads a prefill's KV, ``router.enginesim.disagg_vllm``).

A request's side in prefill/decode disaggregation, and its wait for the other engine, are
``router.enginesim.disagg``'s: they come before its admission.

With ``SimSettings.events`` the prefix cache publishes its KV cache events as vLLM does
(``router.enginesim.kv_publisher``): every admission's stored and evicted blocks, and
``AllBlocksCleared`` on ``/reset``.

A request's body is read once, parsed (``router.enginesim.requests``), admitted by the engine
(``router.enginesim.engine``), and answered with the bodies of ``router.enginesim.responses``.
Stream headers go out at once (as vLLM's do); the first token is sent at the schedule's
first-token time and the rest one decode step apart; ``--fast`` drops every delay. Refusals
and failures are rendered by the gateway's error middleware in vLLM's dialect.

``--api-key KEY`` puts every route (test hooks included) behind ``Authorization: Bearer KEY``.

Test hook, fault injection: ``POST /fault`` makes the next generation requests fail, hang or
drop mid-answer. The faults and the aborts (``/abort_request``, a dropped answer's reset
connection) are ``router.enginesim.faults``'s; this app only plays them.

Test hook, reported load: ``POST /load {"waiting": N}`` makes /metrics (and /stats) report N
more waiting requests than the engine really has, as if other clients queued them; 0 stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router import hostport
from router.enginesim.api_replies import reply_for
from router.enginesim.app_keys import DISAGG, ENGINE, EVENTS, PUBLISHER, REGISTRY, RUNS, STORE
from router.enginesim.cancel import Runs
from router.enginesim.disagg import Disagg
from router.enginesim.disagg_vllm import PULL_PATH
from router.enginesim.engine import Engine, SimSettings, Ticket
from router.enginesim.faults import (
    DROP_AFTER_TOKENS,
    abort_connection,
    abort_request,
    fault,
    half_body,
    play_fault,
)
from router.enginesim.kv_publisher import CacheEvents, Publisher
from router.enginesim.metrics import registry_for
from router.enginesim.requests import EMBEDDINGS, Endpoint, parse_embedding, parse_generation
from router.enginesim.responses import Reply, embeddings_body, models_body
from router.enginesim.stored import ResponseStore
from router.enginesim.tokens import prompt_text, prompt_tokens, token_ids
from router.gateway.openai import sse
from router.gateway.openai.errors import (
    BadRequest,
    NotFound,
    api_of,
    error_middleware,
    stream_error,
    vllm_dialect,
)
from router.gateway.openai.request import json_object, parse

log = logging.getLogger(__name__)

# Long-context prompts (100k+ tokens of JSON) must fit; anything larger is a client bug.
MAX_BODY_BYTES = 64 * 1024 * 1024
# In-flight streams get this long to finish on SIGTERM before they are cancelled.
SHUTDOWN_GRACE_SECONDS = 2.0
# A W3C traceparent is 55 characters; /stats keeps no more of whatever a client sends.
TRACEPARENT_CHARS = 64

# What /tokenize reports as the context length (engine-sim has no limit of its own).
MAX_MODEL_LEN = 131_072


def _json(value: Any) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")


async def _sleep_until(engine: Engine, when: float) -> None:
    delay = when - engine.now()
    if delay > 0:
        await asyncio.sleep(delay)


async def _stream(
    request: web.Request, engine: Engine, reply: Reply, ticket: Ticket, drop: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=sse.HEADERS)
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
            abort_connection(request)
            return resp
        if not fast:
            await _sleep_until(engine, sched.done)
        await resp.write(reply.tail())
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left; the caller releases the request
    except Exception as exc:
        log.exception("stream failed on %s", request.path)
        # Headers are gone already: end the stream the way OpenAI servers report errors in it.
        with contextlib.suppress(ConnectionError):
            await resp.write(stream_error(exc, vllm_dialect, api=api_of(request.path)))
    return resp


async def _json_answer(request: web.Request, body: bytes, drop: bool) -> web.StreamResponse:
    if drop:
        return await half_body(request, body)
    return web.Response(body=body, content_type="application/json")


async def _answer(
    request: web.Request, engine: Engine, reply: Reply, ticket: Ticket, drop: bool
) -> web.StreamResponse:
    if not engine.settings.fast:
        await _sleep_until(engine, ticket.schedule.done)
    ticket.emitted = reply.gen.max_tokens * reply.gen.choices
    return await _json_answer(request, reply.full(), drop)


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    engine = request.app[ENGINE]
    if "traceparent" in request.headers:
        engine.traceparents.append(request.headers["traceparent"][:TRACEPARENT_CHARS])
    drop = await play_fault(engine)
    store = request.app[STORE]
    gen = parse_generation(await request.read(), endpoint, engine.settings, store.continued)
    rid = gen.rid or request.headers.get("X-Request-Id") or ""
    close = functools.partial(abort_connection, request)
    side = await request.app[DISAGG].arrive(gen, rid, close)
    gen = side.gen
    ticket = engine.admit(gen.keys, gen.prompt_tokens, gen.max_tokens, side.transferred)
    events = request.app.get(EVENTS)
    if events is not None and gen.text is not None:
        # Right after admission, with no await between: events leave in cache order.
        ids = functools.partial(token_ids, gen.text)
        request.app[PUBLISHER].publish(events.admitted(gen.keys, ids, engine.now()))
    runs = request.app[RUNS]
    run = runs.start(rid, ticket, gen.max_tokens, gen.choices, close)
    try:
        await side.handover(ticket)
        reply = side.answer(reply_for(gen, engine.settings.model, ticket.cached, store))
        if gen.stream:
            return await _stream(request, engine, reply, ticket, drop)
        return await _answer(request, engine, reply, ticket, drop)
    except asyncio.CancelledError:
        runs.left(run)
        raise
    finally:
        transport = request.transport
        if not drop and (transport is None or transport.is_closing()):
            runs.left(run)  # a write found the client gone
        runs.finish(run)
        side.close()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generate(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generate(request, Endpoint.COMPLETIONS)


async def responses(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    return await _generate(request, Endpoint.RESPONSES)


async def messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages."""
    return await _generate(request, Endpoint.MESSAGES)


async def count_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens: the prompt's tokens, as Anthropic's ``input_tokens``."""
    engine = request.app[ENGINE]
    inbound = parse(await request.read(), Endpoint.MESSAGES.value)
    if inbound.model != engine.settings.model:
        raise NotFound(f"The model `{inbound.model}` does not exist.", "model")
    return _json({"input_tokens": prompt_tokens(prompt_text(inbound, engine.settings.tokenizer))})


async def embeddings(request: web.Request) -> web.StreamResponse:
    """POST /v1/embeddings: one deterministic unit vector per input."""
    engine = request.app[ENGINE]
    drop = await play_fault(engine)
    req = parse_embedding(await request.read(), engine.settings)
    # Embeddings pay prefill like any prompt but neither read nor fill the prefix cache.
    ticket = engine.admit((), req.prompt_tokens, 0)
    try:
        if not engine.settings.fast:
            await _sleep_until(engine, ticket.schedule.done)
        return await _json_answer(request, embeddings_body(req, engine.settings.model), drop)
    finally:
        engine.release(ticket)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one served model."""
    engine = request.app[ENGINE]
    body = models_body(engine.settings.model, engine.started)
    return web.Response(body=body, content_type="application/json")


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
    return _json({**request.app[ENGINE].stats(), **request.app[DISAGG].stats()})


async def reset(request: web.Request) -> web.Response:
    """POST /reset: empty the cache, the clock and the counters; answer the fresh stats."""
    engine = request.app[ENGINE]
    engine.reset()
    request.app[DISAGG].held.close()
    request.app[STORE].clear()
    events = request.app.get(EVENTS)
    if events is not None:
        request.app[PUBLISHER].publish(events.cleared())
    return _json(engine.stats())


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize: the prompt's token ids, as vLLM answers them."""
    engine = request.app[ENGINE]
    body = json_object(await request.read())
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if "messages" not in body and "prompt" not in body:
        raise BadRequest("give 'prompt' or 'messages'", "prompt")
    inbound = parse(orjson.dumps(body), route)
    if inbound.model != engine.settings.model:
        raise NotFound(f"The model `{inbound.model}` does not exist.", "model")
    engine.counters.tokenize_requests += 1
    ids = token_ids(prompt_text(inbound, engine.settings.tokenizer))
    return _json({"tokens": ids, "count": len(ids), "max_model_len": MAX_MODEL_LEN})


async def extra_load(request: web.Request) -> web.Response:
    """POST /load: report extra waiting requests (a test hook, see the module docstring)."""
    engine = request.app[ENGINE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        body = None
    waiting = body.get("waiting") if isinstance(body, dict) else None
    if not isinstance(waiting, int) or isinstance(waiting, bool) or not 0 <= waiting <= 1_000_000:
        raise BadRequest("'waiting' must be an integer from 0 to 1000000", param="waiting")
    engine.extra_waiting = waiting
    return _json({"waiting": waiting})


def _key_required(key: str) -> Middleware:
    """401 unless the request carries ``Authorization: Bearer key`` (vLLM's answer)."""
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def build_app(settings: SimSettings) -> web.Application:
    """The engine as an aiohttp application (serve it with ``serving`` or an AppRunner)."""
    middlewares = [error_middleware(MAX_BODY_BYTES, vllm_dialect)]
    if settings.api_key:
        middlewares.insert(0, _key_required(settings.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    engine = Engine(settings)
    app[ENGINE] = engine
    app[REGISTRY] = registry_for(engine)
    app[RUNS] = Runs(engine)
    app.on_cleanup.append(_end_runs)
    disagg = app[DISAGG] = Disagg(engine)
    app.cleanup_ctx.append(disagg.lifetime)
    app[STORE] = ResponseStore()
    if settings.events is not None:
        spec = settings.spec
        app[EVENTS] = CacheEvents(
            spec.capacity_tokens // spec.block_tokens,
            spec.block_tokens,
            settings.events.encoding,
            settings.events.hashes,
        )
        app[PUBLISHER] = Publisher(settings.events)
        app.cleanup_ctx.append(_publisher_ctx)
    app.add_routes(
        [
            web.post(Endpoint.CHAT.value, chat_completions),
            web.post(Endpoint.COMPLETIONS.value, completions),
            web.post(EMBEDDINGS, embeddings),
            web.post(Endpoint.RESPONSES.value, responses),
            web.post(Endpoint.MESSAGES.value, messages),
            web.post("/v1/messages/count_tokens", count_tokens),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", metrics),
            web.get("/stats", stats),
            web.post("/reset", reset),
            web.post("/fault", fault),
            web.post("/load", extra_load),
            web.post("/tokenize", tokenize),
            web.post("/abort_request", abort_request),
            web.post(PULL_PATH, disagg.serve_pull),
        ]
    )
    return app


async def _end_runs(app: web.Application) -> None:
    app[RUNS].close()


async def _publisher_ctx(app: web.Application) -> AsyncIterator[None]:
    publisher = app[PUBLISHER]
    publisher.start()
    try:
        yield
    finally:
        await publisher.close()


@asynccontextmanager
async def serving(
    settings: SimSettings, host: str = hostport.LOOPBACK, port: int = 0
) -> AsyncIterator[str]:
    """Serve an engine on ``host:port`` (0: a free port) while the block runs; yield its URL."""
    # A client that disconnects must cancel its handler, so generation stops with it.
    runner = web.AppRunner(
        build_app(settings),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if port == 0 else port
        runner.app[DISAGG].serving_at(host, bound)
        yield f"http://{hostport.join(host, bound)}"
    finally:
        await runner.cleanup()
