"""The composition root: one ``Gateway`` built from the config, and what its exchanges share.

``Gateway`` wires the routing core to the I/O shell (engine pool, upstream, policy watcher,
metrics, admission, precise mode); ``Services`` is what every ``Exchange``
(router.gateway.exchange) uses of it. router.gateway.app serves a ``Gateway``: routes and the
background loops it owns.

Build a ``Gateway`` inside a running event loop (its upstream opens an aiohttp session).

With gossip configured, the gateway is one replica of a fleet (``router.gateway.replicas.replica``):
the index gossips under a per-run origin, every ``Delta`` an exchange records is published to the
gossip queue, remote deltas and loads merge into ``core.index`` and ``core.loads``,
``gossip_peers`` and ``gossip_samples`` feed the ``kvrouter_gossip_*`` metrics, and the node
runs in one more ``cleanup_ctx`` of the app (the first started, the last stopped).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from router.core.decision import CoreSettings, RoutingCore
from router.core.disaggregation import DisaggSettings, Role
from router.core.index import Delta
from router.core.load import EngineReport, Load
from router.core.policy import Policy
from router.core.precise import PreciseSettings, TokenPrompt
from router.core.response_homes import ResponseHomes
from router.core.retry_budget import BudgetRules, RetryBudget
from router.gateway.config.engine_keys import EngineKeys
from router.gateway.config.models import ModelAliases
from router.gateway.config.reload import ModelsWatcher, PolicyWatcher, Result
from router.gateway.config.serving import Forwarding, Limits, Timeouts
from router.gateway.config.settings import Config
from router.gateway.config.tracing import export
from router.gateway.fleet.pods import PodWatcher
from router.gateway.fleet.pool import EnginePool, Resolver, resolve_dns
from router.gateway.fleet.scrape import EngineMetricsScraper
from router.gateway.inbound.admission import Admission
from router.gateway.inbound.auth import load_keys
from router.gateway.inbound.connections import Connections
from router.gateway.metrics import FleetView, Metrics
from router.gateway.openai.request import BodyParser, Inbound
from router.gateway.precise.engines import PreciseEngines
from router.gateway.precise.kv_events import EventMetrics, Subscriber
from router.gateway.precise.tokenize import Tokenizer
from router.gateway.receipt import Receipts, no_receipts
from router.gateway.replicas.delegate import run_origin
from router.gateway.runtime.drain import Drain
from router.gateway.tracing.tracer import Tracing
from router.gateway.upstream.abort import Aborts
from router.gateway.upstream.client import HttpUpstream, Upstream
from router.gateway.upstream.relay import HoldBudget
from router.local_tokenizer import configured

if TYPE_CHECKING:
    from router.gateway.replicas.replica import Replica
    from router.gossip import GossipConfig, Sample


def keep_local(_delta: Delta) -> None:
    """Where deltas go without replicas: nowhere (the index already has them)."""


@dataclass(frozen=True, slots=True)
class Services:
    """What every exchange uses: the routing core and the gateway's shell around it."""

    core: RoutingCore
    pool: EnginePool
    upstream: Upstream
    metrics: Metrics
    timeouts: Timeouts
    limits: Limits
    admission: Admission
    forwarding: Forwarding = field(default_factory=Forwarding)
    retry_budget: RetryBudget = field(default_factory=RetryBudget)
    clock: Callable[[], float] = time.monotonic
    # Where recorded deltas go (the gossip queue when replicas are configured).
    publish: Callable[[Delta], None] = keep_local
    # Bodies parsed with bounded memory, large ones off the event loop
    # (router.gateway.openai.request).
    bodies: BodyParser = field(default_factory=BodyParser)
    # The request's token ids from the engines' tokenizer (router.gateway.precise.tokenize), for
    # engines whose KV events the index holds; None: route on the text keys alone.
    tokenize: Callable[[Inbound], Awaitable[TokenPrompt | None]] | None = None
    # Which engine stored which response (stateful Responses requests go there).
    responses: ResponseHomes = field(default_factory=ResponseHomes)
    # Exchanges in flight, and the cut at the end of a stop's grace period.
    drain: Drain = field(default_factory=Drain)
    # What non-streamed answers held until their end may take together
    # (router.gateway.upstream.relay).
    holds: HoldBudget = field(default_factory=HoldBudget)
    # Aborts for engines that take one when a client leaves (router.gateway.upstream.abort).
    aborts: Aborts = field(default_factory=Aborts)
    # The model aliases live now (router.gateway.config.models; the config file is watched).
    aliases: Callable[[], ModelAliases] = ModelAliases
    # Spans of each request, and the trace context engines get (router.gateway.tracing).
    tracing: Tracing = field(default_factory=lambda: Tracing(None))
    # Where each request's receipt ends: routing-quality counters, the access log.
    receipts: Receipts = field(default_factory=no_receipts)
    # How requests are split between prefill and decode engines (router.core.disaggregation):
    # in play once ``roles()`` names an engine.
    disaggregation: DisaggSettings = field(default_factory=DisaggSettings)

    def roles(self) -> Mapping[str, Role]:
        """The engines whose role is prefill or decode (empty: an aggregated fleet)."""
        return self.pool.roles()


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
        kv, em = config.engines.kv_events, config.engine_metrics
        steer = CoreSettings(
            PreciseSettings(kv.medium_weights, kv.bridge_seconds), em.stale_after_seconds
        )
        self.core = RoutingCore(self.watcher.load_initial(), origin, steer)
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
                roles=lambda: self.pool.roles(),
            )
        )
        self.retry_budget = RetryBudget(BudgetRules(ratio=config.limits.retry_budget_percent / 100))
        self.aborts = Aborts(
            self.upstream,
            self._kind_of,
            lambda result: self.metrics.engine_aborts.labels(result).inc(),
        )
        self.pool = EnginePool(
            config.engines,
            config.health,
            self.upstream,
            self._set_engines,
            clock=clock,
            resolver=resolver,
        )
        # The config file's models section, applied again when the file changes.
        self.models = config.models
        self.config_watcher: ModelsWatcher | None = None
        if config.source:
            self.config_watcher = ModelsWatcher(
                Path(config.source),
                self._set_models,
                lambda result: self.metrics.config_reloads.labels(result).inc(),
                config.policy_reload.interval_seconds,
                poll=config.policy_reload.enabled,
            )
            self.models = self.config_watcher.load_initial()  # raises ConfigError
        self.pool.set_aliases(self.models.aliases)
        # Raises ConfigError without the Kubernetes client: no start without it.
        self.pods = (
            PodWatcher(config.engines.pods, self.pool.set_addresses)
            if config.engines.pods is not None
            else None
        )
        # The engines' own load, blended into the core's LoadBook (router.core.load).
        self.engine_metrics = EngineMetricsScraper(
            em,
            self.upstream,
            lambda: [url for url, b in self.pool.engines.items() if b.healthy],
            self.core.loads.engine_report,
            clock=clock,
            count=lambda result: self.metrics.engine_scrapes.labels(result).inc(),
            capacity=self.core.engine_capacity,
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
        self.event_metrics = EventMetrics(self.metrics.registry)
        self.precise = PreciseEngines(self.core, self.pool, self.event_metrics)
        self.kv_events: Subscriber | None = None
        self.tokenizer: Tokenizer | None = None
        if kv.enabled:
            self.kv_events = Subscriber(self.core, kv, self._healthy, self.event_metrics, clock)
            self.tokenizer = Tokenizer(
                kv.tokenize_timeout_seconds,
                self.precise.engines,
                self.precise.tokenized,
                upstream=self.upstream,  # the engines' API keys go with every call
                # Raises ConfigError: no start without it.
                local=configured(kv.tokenizer, config.engines.key("kv_events.tokenizer")),
                holds=self.precise.held_whole,
            )
        # Raises ConfigError: no start on a tracing setup (file, OTEL_* variables) it cannot honour.
        self.tracing = Tracing(export(config.tracing, environ))
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
            self.retry_budget,
            clock=clock,
            publish=self.replica.queue if self.replica is not None else keep_local,
            bodies=self.bodies,
            tokenize=self.tokenizer,
            drain=self.drain,
            aborts=self.aborts,
            aliases=lambda: self.models,
            tracing=self.tracing,
            receipts=Receipts(config.access_log, self.metrics.quality, self.core.precise),
            disaggregation=config.disaggregation,
        )

    def _kind_of(self, engine: str) -> str:
        """How ``engine`` takes an abort: its configured kind; a prefill or decode engine
        under SGLang's protocol is an SGLang server whatever its entry says."""
        if self.config.disaggregation.protocol == "sglang" and self.pool.role_of(engine) != "both":
            return "sglang"
        return self.pool.kind_of(engine)

    def _healthy(self) -> Mapping[str, bool]:
        return {url: b.healthy for url, b in self.pool.engines.items()}

    def _set_policy(self, policy: Policy) -> None:
        # One assignment on the event loop: requests in flight keep their decisions, and the
        # loads they took are released into the same LoadBook.
        self.core.set_policy(policy)

    def _reloaded(self, result: Result) -> None:
        self.metrics.reloads.labels(result).inc()

    def _set_models(self, models: ModelAliases) -> None:
        # One assignment on the event loop, like a policy: a request reads it once.
        self.models = models
        self.pool.set_aliases(models.aliases)

    def reload(self) -> None:
        """Reload the policy file and the config file's models section now (SIGHUP)."""
        self.watcher.request()
        if self.config_watcher is not None:
            self.config_watcher.request()

    def _set_engines(self, weights: Mapping[str, int]) -> None:
        self.core.set_engines(weights)
        self.metrics.forget_engines(weights)
        self.retry_budget.forget(set(weights))
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
            report = self.core.loads.engine_reported(url, now)
            if report is not None:
                yield url, report

    async def config_watch_loop(self) -> None:
        """Watch the config file's models section while the app runs."""
        if self.config_watcher is not None:
            await self.config_watcher.run()

    async def pods_loop(self) -> None:
        """Follow the Kubernetes pods that are engines while the app runs."""
        if self.pods is not None:
            await self.pods.run()

    async def kv_events_loop(self) -> None:
        """Subscribe to the engines' KV events while the app runs."""
        if self.kv_events is not None:
            await self.kv_events.run()

    async def tokenizer_check_loop(self) -> None:
        """Check the local tokenizer against each precise engine (Tokenizer.check_loop)."""
        if self.tokenizer is not None:
            await self.tokenizer.check_loop(self.precise.models)

    def ready(self) -> tuple[bool, str]:
        """Readiness and why: a policy is loaded and at least one engine is healthy."""
        if self.drain.started:
            return False, "shutting down"
        if not self.pool.ready():
            return False, "no healthy engine yet"
        return True, "ready"
