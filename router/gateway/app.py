"""The gateway's aiohttp application: its routes and the background work it owns.

``build_app`` serves a ``Gateway`` (router.gateway.wiring, the composition root): the OpenAI
routes, each generation request one ``Exchange`` (router.gateway.exchange); the probes
Kubernetes needs; ``/metrics``; and admin endpoints behind a bearer token. Every background
loop (health probes, model lists, DNS, the policy and config watchers, the engines' /metrics
scraper, the replica's gossip node) is started and stopped by a ``cleanup_ctx``, so the app's
shutdown cancels and awaits all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from router.gateway.disagg import paths as disagg
from router.gateway.exchange import Exchange, decide
from router.gateway.inbound.auth import auth_middleware
from router.gateway.inbound.body import read_body
from router.gateway.inbound.connections import no_banner, request_middleware
from router.gateway.inbound.request_id import id_header
from router.gateway.openai.errors import NotFound, Unauthorized, error_middleware
from router.gateway.openai.request import PROMPT_FIELD
from router.gateway.receipt import route_headers
from router.gateway.wiring import Gateway

log = logging.getLogger(__name__)

# A crashed background loop is restarted after this pause instead of leaving the gateway blind.
RESTART_PAUSE_SECONDS = 1.0


GATEWAY = web.AppKey("gateway", Gateway)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


# -- generation routes ---------------------------------------------------------------------


def _generation(route: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await Exchange(request.app[GATEWAY].services, request, route).run()

    handler.__doc__ = f"POST {route}: one ``Exchange`` routes it and relays the answer."
    return handler


# -- read-only routes ----------------------------------------------------------------------


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the union of the healthy engines' models."""
    body = request.app[GATEWAY].pool.models_body()
    return web.Response(body=body, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """GET /health: liveness (the process serves)."""
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """GET /ready: 200 once a policy is loaded and an engine is healthy, else 503."""
    gw = request.app[GATEWAY]
    ok, reason = gw.ready()
    healthy = sum(1 for b in gw.pool.engines.values() if b.healthy)
    body = {
        "status": "ready" if ok else "not ready",
        "reason": reason,
        "policy": gw.core.policy.name,
        "backends": len(gw.pool.engines),
        "healthy_backends": healthy,
    }
    return _json(body, 200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text from the app's own registry."""
    body = request.app[GATEWAY].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# -- admin routes --------------------------------------------------------------------------


def _admin(
    method: str,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Only with ``Authorization: Bearer <token>``; absent (404) when no token is set.

    Mounted for every method: with admin off, a wrong method must answer 404 as well, or its
    405 would tell a prober the route exists. The method is checked after the token.
    """

    async def guarded(request: web.Request) -> web.StreamResponse:
        token = request.app[GATEWAY].admin_token
        if token is None:
            raise NotFound(f"no route for {request.method} {request.path}", code="not_found")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not _same_token(given.strip(), token):
            raise Unauthorized("admin endpoints need 'Authorization: Bearer <admin token>'")
        if request.method != method:
            raise web.HTTPMethodNotAllowed(request.method, [method])
        return await handler(request)

    guarded.__doc__ = handler.__doc__
    return guarded


def _same_token(given: str, token: str) -> bool:
    """Whether ``given`` is ``token``, compared in constant time as the bytes sent.

    A header's bytes that are not UTF-8 arrive as surrogate escapes: encoded back the same
    way, any header compares (unequal) instead of failing to encode.
    """
    try:
        sent = given.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False  # a lone surrogate no byte decodes to: not the token
    # Constant time: the time taken must not reveal how much of a guess matched.
    return hmac.compare_digest(sent, token.encode("utf-8", "surrogateescape"))


async def debug_route(request: web.Request) -> web.Response:
    """POST /debug/route[?route=PATH]: how a request body would be routed, without sending or
    recording it (read as ``PATH``'s body, else as chat, completions or embeddings)."""
    gw = request.app[GATEWAY]
    raw = await read_body(request, gw.config.limits.max_body_bytes)
    try:
        probe = orjson.loads(raw)
    except orjson.JSONDecodeError:
        probe = None
    route = "/v1/chat/completions"
    if isinstance(probe, dict) and "messages" not in probe:
        route = "/v1/embeddings" if "input" in probe else "/v1/completions"
    if request.query.get("route") in PROMPT_FIELD:  # a body of another API, read as it is
        route = request.query["route"]
    inbound = gw.models.rewrite(await gw.bodies.parse(raw, route), raw)[0]
    tokenized = await gw.tokenizer(inbound) if gw.tokenizer is not None else None
    split = disagg.decide(gw.services, route, inbound, request.headers, tokenized)
    if split is not None:  # both estimates, the transfer and the path chosen
        return _json({"policy": gw.core.policy.name, **disagg.explain(split)})
    d = decide(gw.services, inbound, request.headers, tokenized)
    return _json({"policy": gw.core.policy.name, **d.explain()})


async def debug_backends(request: web.Request) -> web.Response:
    """GET /debug/backends: every known backend's health, models and in-flight load."""
    gw = request.app[GATEWAY]
    now = gw.clock()
    out = []
    for url, b in gw.pool.engines.items():
        load = gw.core.loads.local(url)
        h = b.health
        out.append(
            {
                "url": url,
                "source": b.source,
                "state": h.state.value,
                "consecutive_failures": h.failures,
                "readmit_in_seconds": max(0.0, h.readmit_at - now) if b.health.readmit_at else 0,
                "models": sorted(b.models or ()),
                "inflight_requests": load.requests,
                "inflight_tokens": load.tokens,
                "index_blocks": gw.core.index.blocks(url),
                "index_capacity_blocks": gw.core.index.capacity_blocks(url),
            }
        )
    return _json({"backends": out})


# -- background work -----------------------------------------------------------------------


async def _forever(name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run ``loop``; if it crashes, log why and run it again."""
    while True:
        try:
            await loop()
            return
        except Exception:
            log.exception("background task %s crashed; restarting it", name)
            await asyncio.sleep(RESTART_PAUSE_SECONDS)


def _task_ctx(
    name: str, loop: Callable[[Gateway], Callable[[], Awaitable[None]]]
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """A cleanup_ctx that runs one background loop while the app runs, and stops it after."""

    @contextlib.asynccontextmanager
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_forever(name, loop(app[GATEWAY])), name=name)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx


def _replica_ctx(app: web.Application) -> contextlib.AbstractAsyncContextManager[None]:
    replica = app[GATEWAY].replica
    assert replica is not None
    return replica.running()


@contextlib.asynccontextmanager
async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await app[GATEWAY].aborts.close()
        await app[GATEWAY].upstream.close()
        tokenizer = app[GATEWAY].tokenizer
        if tokenizer is not None:
            await tokenizer.close()
        await app[GATEWAY].tracing.close()


def build_app(gw: Gateway) -> web.Application:
    """The gateway as an aiohttp application (serve it with ``handler_cancellation=True``)."""
    limit = gw.config.limits.max_body_bytes
    middlewares = [request_middleware, error_middleware(limit), auth_middleware(gw.api_keys)]
    app = web.Application(middlewares=middlewares, client_max_size=limit)
    app.on_response_prepare.append(no_banner)
    app.on_response_prepare.append(id_header)
    app.on_response_prepare.append(_closing)
    if gw.config.route_headers:
        app.on_response_prepare.append(route_headers)
    app[GATEWAY] = gw
    if gw.replica is not None:
        # First in, last out: peers keep hearing this replica's load while it drains.
        app.cleanup_ctx.append(_replica_ctx)
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_task_ctx("health-probes", lambda g: g.pool.health_loop))
    app.cleanup_ctx.append(_task_ctx("model-lists", lambda g: g.pool.models_loop))
    app.cleanup_ctx.append(_task_ctx("dns-discovery", lambda g: g.pool.dns_loop))
    if gw.pods is not None:
        app.cleanup_ctx.append(_task_ctx("pod-discovery", lambda g: g.pods_loop))
    app.cleanup_ctx.append(_task_ctx("policy-watcher", lambda g: g.watcher.run))
    if gw.config_watcher is not None:
        app.cleanup_ctx.append(_task_ctx("config-watcher", lambda g: g.config_watch_loop))
    if gw.kv_events is not None:
        app.cleanup_ctx.append(_task_ctx("kv-events", lambda g: g.kv_events_loop))
        if gw.config.engines.kv_events.tokenizer != "engine":
            app.cleanup_ctx.append(_task_ctx("tokenizer-check", lambda g: g.tokenizer_check_loop))
    app.cleanup_ctx.append(_task_ctx("engine-metrics", lambda g: g.engine_metrics.run))
    app.cleanup_ctx.append(_task_ctx("flow-control", lambda g: g.admission.pump_loop))
    if gw.config.epp.proxy:  # else Envoy proxies, and the picker decides (epp.proxy: false)
        app.add_routes([web.post(route, _generation(route)) for route in PROMPT_FIELD])
        app.add_routes([web.get("/v1/models", models)])
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/ready", ready),
            web.route("*", "/debug/route", _admin("POST", debug_route)),
            web.route("*", "/debug/backends", _admin("GET", debug_backends)),
        ]
    )
    if not gw.config.listen.metrics_port:
        app.add_routes([web.get("/metrics", metrics)])
    return app


async def _closing(request: web.Request, response: web.StreamResponse) -> None:
    """While the gateway stops, every answer closes its connection: the client reconnects
    to another replica instead of sending its next request here."""
    if request.app[GATEWAY].drain.started:
        response.force_close()
        response.headers["Connection"] = "close"  # the head is built before this hook runs


def build_metrics_app(gw: Gateway) -> web.Application:
    """``/metrics`` alone, for ``listen.metrics_port``; ``gw`` runs in ``build_app``'s app."""
    app = web.Application(middlewares=[request_middleware, error_middleware(0)])
    app.on_response_prepare.append(no_banner)
    app[GATEWAY] = gw
    app.add_routes([web.get("/metrics", metrics)])
    return app
