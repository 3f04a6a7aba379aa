"""The gateway's aiohttp application: state, handlers, and the background work it owns.

``Gateway`` wires the routing core to the I/O shell (engine pool, upstream, policy watcher,
metrics); each generation request is one ``Exchange`` (router.gateway.exchange) over them.
``build_app`` serves it: the OpenAI routes, the probes Kubernetes needs,
``/metrics``, and admin endpoints behind a bearer token. Every background loop (health probes,
model lists, DNS, the policy watcher, the engines' /metrics scraper) is started and stopped by a
``cleanup_ctx``, so the app's shutdown cancels and awaits all of them.

Build a ``Gateway`` inside a running event loop (its upstream opens an aiohttp session).

With gossip configured, the gateway is one replica of a fleet (``router.gateway.replicas.replica``):
the index gossips under a per-run origin, every ``Delta`` an exchange records is published to the
gossip queue, remote deltas and loads merge into ``core.index`` and ``core.loads``,
``gossip_peers`` and ``gossip_samples`` feed the ``kvrouter_gossip_*`` metrics, and the node
runs in one more ``cleanup_ctx`` (the first started, the last stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from router.core.decision import RoutingCore
from router.core.kv_events import token_keys
from router.core.load import EngineReport, Load
from router.core.policy import Policy
from router.core.retry_budget import BudgetRules, RetryBudget
from router.gateway.config.engine_keys import EngineKeys
from router.gateway.config.reload import PolicyWatcher, Result
from router.gateway.config.settings import Config
from router.gateway.exchange import (
    Exchange,
    Services,
    decide,
    id_header,
    keep_local,
    read_body,
)
from router.gateway.fleet.pool import EnginePool, Resolver, resolve_dns
from router.gateway.fleet.scrape import EngineMetricsScraper
from router.gateway.inbound.admission import Admission
from router.gateway.inbound.auth import auth_middleware, load_keys
from router.gateway.inbound.connections import Connections, no_banner, request_middleware
from router.gateway.metrics import FleetView, Metrics
from router.gateway.openai.errors import (
    GatewayError,
    NotFound,
    Unauthorized,
    error_middleware,
)
from router.gateway.openai.request import PROMPT_FIELD, BodyParser
from router.gateway.precise.kv_events import EventMetrics, Subscriber
from router.gateway.precise.tokenize import Tokenizer
from router.gateway.replicas.delegate import run_origin
from router.gateway.runtime.drain import Drain
from router.gateway.upstream.client import HttpUpstream, Upstream
from router.local_tokenizer import configured

if TYPE_CHECKING:
    from router.gateway.replicas.replica import Replica
    from router.gossip import GossipConfig, Sample

log = logging.getLogger(__name__)

# A crashed background loop is restarted after this pause instead of leaving the gateway blind.
RESTART_PAUSE_SECONDS = 1.0


class Gateway:
    """The running gateway's state: routing core, engines, upstream, metrics."""

    def __init__(
        self,
        config: Config,
        policy_path: Path,
        *,
        upstream: Upstream | None = None,
        clock: Callable[[], float] = time.monotonic,
        resolver: Resolver = resolve_dns,
        environ: Mapping[str, str] = os.environ,
        gossip: GossipConfig | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        # In-flight exchanges, and the stop's grace period (router.gateway.runtime.drain).
        self.drain = Drain()
        self.watcher = PolicyWatcher(
            policy_path,
            self._set_policy,
            self._reloaded,
            config.policy_reload.interval_seconds,
            poll=config.policy_reload.enabled,
        )
        origin = "local"
        if gossip is not None:
            # Unique per process run: a restarted replica numbers its deltas from 1 again.
            origin = run_origin(gossip.node_id)
        # Raises PolicyError: the gateway does not start on a policy it cannot read.
        self.core = RoutingCore(self.watcher.load_initial(), origin)
        # Raises ConfigError: the gateway does not start without the engine keys it names.
        keys = EngineKeys(config.engines, environ)
        self.upstream: Upstream = upstream or HttpUpstream(
            config.timeouts.connect_seconds, authorization=keys
        )
        # Peers by membership state, for kvrouter_gossip_peers; gossip replaces it.
        self.gossip_peers: Callable[[], Mapping[str, int]] = lambda: {"alive": 0}
        # The other kvrouter_gossip_* series; gossip replaces it.
        self.gossip_samples: Callable[[], Iterable[Sample]] = lambda: ()
        self.metrics = Metrics(
            FleetView(
                engines=self._engine_health,
                local_load=self._local_load,
                index_entries=lambda: len(self.core.index),
                gossip_peers=lambda: self.gossip_peers(),
                gossip=lambda: self.gossip_samples(),
                connections_open=lambda: self.connections.open,
                connections_rejected=lambda: self.connections.rejected,
                engine_reports=self._engine_reports,
                queue_depth=lambda: self.admission.depth(),
            )
        )
        self.pool = EnginePool(
            config.engines,
            config.health,
            self.upstream,
            self._set_engines,
            clock=clock,
            resolver=resolver,
        )
        # The engines' own load, blended into the core's LoadBook (router.core.load).
        em = config.engine_metrics
        self.core.loads.stale_after = em.stale_after_seconds
        self.engine_metrics = EngineMetricsScraper(
            em,
            self.upstream,
            lambda: [url for url, b in self.pool.engines.items() if b.healthy],
            self.core.loads.engine_report,
            clock=clock,
            count=lambda result: self.metrics.engine_scrapes.labels(result).inc(),
        )
        # Raises ConfigError: the gateway does not start with keys it cannot read.
        self.api_keys = load_keys(config.auth.api_keys_file, config.auth.api_keys_env, environ)
        # Admin endpoints exist only when the token's variable is set (read once, at start).
        self.admin_token: str | None = environ.get(config.admin_token_env) or None
        self.replica: Replica | None = None
        if gossip is not None:
            # grpc is loaded only when gossip is on
            from router.gateway.replicas.replica import Replica

            self.replica = Replica(gossip, self.core, now=clock)
            self.gossip_peers = self.replica.peers
            self.gossip_samples = self.replica.samples
        self.admission = Admission(config.flow_control, self.core, self.metrics, clock=clock)
        # Engines' KV cache events (router.gateway.precise.kv_events) and the token ids they need.
        kv = config.engines.kv_events
        self.core.bridge_seconds = kv.bridge_seconds
        self.core.medium_weights = kv.medium_weights
        self.event_metrics = EventMetrics(self.metrics.registry)
        self._index_sources()
        self.kv_events: Subscriber | None = None
        self.tokenizer: Tokenizer | None = None
        if kv.enabled:
            self.kv_events = Subscriber(self.core, kv, self._healthy, self.event_metrics, clock)
            self.tokenizer = Tokenizer(
                kv.tokenize_timeout_seconds,
                self._precise_engines,
                self._tokenized,
                upstream=self.upstream,  # the engines' API keys go with every call
                # Raises ConfigError: no start without it.
                local=configured(kv.tokenizer, config.engines.key("kv_events.tokenizer")),
                holds=self._held_whole,
            )
        # Client connections of this process: the cap and the header deadline (runtime).
        self.connections = Connections(config.limits)
        self.bodies = BodyParser(
            config.limits.large_body_bytes,
            config.limits.max_large_body_parses,
            # The tokenizer sends the prompt's fields on to an engine's /tokenize.
            keep_body=self.tokenizer is not None,
        )
        self.services = Services(
            self.core,
            self.pool,
            self.upstream,
            self.metrics,
            config.timeouts,
            config.limits,
            self.admission,
            config.forwarding,
            RetryBudget(BudgetRules(ratio=config.limits.retry_budget_percent / 100)),
            clock=clock,
            publish=self.replica.queue if self.replica is not None else keep_local,
            bodies=self.bodies,
            tokenize=self.tokenizer,
            drain=self.drain,
        )

    def _healthy(self) -> Mapping[str, bool]:
        return {url: b.healthy for url, b in self.pool.engines.items()}

    def _precise_engines(self, model: str) -> Sequence[str]:
        """Healthy engines serving ``model`` whose KV events the index holds."""
        try:
            cands = self.pool.candidates(model)
        except GatewayError:
            return ()
        return [e for e in cands if e in self.core.precise]

    def _held_whole(self, model: str, lora: str | None, ids: Sequence[int]) -> bool:
        """Whether a precise engine serving ``model`` holds every full block of ``ids``."""
        core = self.core
        by_size: dict[int, list[int]] = {}  # engines of one block size share their keys
        for e in self._precise_engines(model):
            size = core.precise[e]
            keys = by_size.get(size)
            if keys is None:
                keys = by_size[size] = token_keys(ids, size, lora)
            if keys and core.index.event_overlap(e, keys, lambda _m: 1.0)[0] == len(keys):
                return True
        return False

    def _tokenized(self, seconds: float | None, ok: bool) -> None:
        if seconds is not None:
            self.event_metrics.tokenize.observe(seconds)
        if not ok:
            self.event_metrics.tokenize_failures.inc()

    def _index_sources(self) -> None:
        # Read at scrape time; the index itself is replaced when the block size changes.
        g = self.event_metrics.entries
        g.labels("event").set_function(self._event_entries)
        g.labels("predicted").set_function(lambda: float(len(self.core.predictions)))
        g.labels("approximate").set_function(
            lambda: float(len(self.core.index)) - self._event_entries() - len(self.core.predictions)
        )

    def _event_entries(self) -> float:
        return float(self.core.index.event_blocks())

    def _set_policy(self, policy: Policy) -> None:
        # One assignment on the event loop: requests in flight keep their decisions, and the
        # loads they took are released into the same LoadBook.
        self.core.set_policy(policy)

    def _reloaded(self, result: Result) -> None:
        self.metrics.reloads.labels(result).inc()

    def _set_engines(self, weights: Mapping[str, int]) -> None:
        self.core.set_engines(weights)
        self.metrics.forget_engines(weights)
        for url in self.core.loads.reporting_engines():
            if url not in weights:
                self.core.loads.drop_engine_report(url)

    def _engine_health(self) -> Iterable[tuple[str, bool]]:
        return [(url, b.healthy) for url, b in self.pool.engines.items()]

    def _local_load(self, engine: str) -> Load:
        return self.core.loads.local(engine)

    def _engine_reports(self) -> Iterable[tuple[str, EngineReport]]:
        now = self.clock()
        for url in self.pool.engines:
            report = self.core.loads.reported(url, now)
            if report is not None:
                yield url, report

    async def kv_events_loop(self) -> None:
        """Subscribe to the engines' KV events while the app runs."""
        if self.kv_events is not None:
            await self.kv_events.run()

    async def tokenizer_check_loop(self) -> None:
        """Check the local tokenizer against each precise engine (Tokenizer.check_loop)."""
        if self.tokenizer is not None:
            await self.tokenizer.check_loop(self._precise_models)

    def _precise_models(self) -> list[tuple[str, str]]:
        """(URL, a model it serves) of each healthy engine whose KV events the index holds."""
        engines = (self.pool.engines.get(url) for url in self.core.precise)
        return [(e.url, next(iter(e.models))) for e in engines if e and e.healthy and e.models]

    def ready(self) -> tuple[bool, str]:
        """Readiness and why: a policy is loaded and at least one engine is healthy."""
        if self.drain.started:
            return False, "shutting down"
        if not self.pool.ready():
            return False, "no healthy engine yet"
        return True, "ready"


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
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Only with ``Authorization: Bearer <token>``; absent (404) when no token is set."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        token = request.app[GATEWAY].admin_token
        if token is None:
            raise NotFound(f"no route for {request.method} {request.path}", code="not_found")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not _same_token(given.strip(), token):
            raise Unauthorized("admin endpoints need 'Authorization: Bearer <admin token>'")
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
    """POST /debug/route: how a request body would be routed, without sending or recording it."""
    gw = request.app[GATEWAY]
    raw = await read_body(request, gw.config.limits.max_body_bytes)
    try:
        probe = orjson.loads(raw)
    except orjson.JSONDecodeError:
        probe = None
    route = "/v1/chat/completions"
    if isinstance(probe, dict) and "messages" not in probe:
        route = "/v1/embeddings" if "input" in probe else "/v1/completions"
    inbound = await gw.bodies.parse(raw, route)
    tokenized = await gw.tokenizer(inbound) if gw.tokenizer is not None else None
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
        await app[GATEWAY].upstream.close()
        tokenizer = app[GATEWAY].tokenizer
        if tokenizer is not None:
            await tokenizer.close()


def build_app(gw: Gateway) -> web.Application:
    """The gateway as an aiohttp application (serve it with ``handler_cancellation=True``)."""
    limit = gw.config.limits.max_body_bytes
    middlewares = [request_middleware, error_middleware(limit), auth_middleware(gw.api_keys)]
    app = web.Application(middlewares=middlewares, client_max_size=limit)
    app.on_response_prepare.append(no_banner)
    app.on_response_prepare.append(id_header)
    app.on_response_prepare.append(_closing)
    app[GATEWAY] = gw
    if gw.replica is not None:
        # First in, last out: peers keep hearing this replica's load while it drains.
        app.cleanup_ctx.append(_replica_ctx)
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_task_ctx("health-probes", lambda g: g.pool.health_loop))
    app.cleanup_ctx.append(_task_ctx("model-lists", lambda g: g.pool.models_loop))
    app.cleanup_ctx.append(_task_ctx("dns-discovery", lambda g: g.pool.dns_loop))
    app.cleanup_ctx.append(_task_ctx("policy-watcher", lambda g: g.watcher.run))
    if gw.kv_events is not None:
        app.cleanup_ctx.append(_task_ctx("kv-events", lambda g: g.kv_events_loop))
        if gw.config.engines.kv_events.tokenizer != "engine":
            app.cleanup_ctx.append(_task_ctx("tokenizer-check", lambda g: g.tokenizer_check_loop))
    app.cleanup_ctx.append(_task_ctx("engine-metrics", lambda g: g.engine_metrics.run))
    app.cleanup_ctx.append(_task_ctx("flow-control", lambda g: g.admission.pump_loop))
    app.add_routes([web.post(route, _generation(route)) for route in PROMPT_FIELD])
    app.add_routes(
        [
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/ready", ready),
            web.post("/debug/route", _admin(debug_route)),
            web.get("/debug/backends", _admin(debug_backends)),
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
