"""The gateway's config file: its model and strict loading.

The file's shape is shared with the Helm chart, so its names are a contract. Every field, with
its default (tests/gateway/config/test_settings.py holds this example to the dataclasses)::

    listen: {host: 0.0.0.0, port: 8000, metrics_port: 0}   # 0: /metrics on the API port
    policy: kv-aware                             # a preset name, or a policy file
    policy_reload: {enabled: true, interval_seconds: 2}
    engines:                                     # or ``backends``, the released spelling
      static: []                        # URLs, or {url: URL, api_key_env: NAME} entries
      dns: {name: "", port: 8000, scheme: http,  # name: a headless Service's DNS name
            interval_seconds: 10, api_key_env: ""}
      models_refresh_seconds: 30
      api_key_env: ""                          # the variable holding the engines' API key
      kv_events: {port: 0, replay_port: 0, topic: "", tokenizer: engine,
                  tokenize_timeout_seconds: 0.5, bridge_seconds: 5,
                  medium_weights: {gpu: 1.0, cpu: 0.5, disk: 0.25},
                  # {ENGINE_URL: {endpoint: tcp://HOST:PORT, replay_endpoint: tcp://HOST:PORT}}
                  endpoints: {}}
    health: {path: /health, interval_seconds: 5, timeout_seconds: 2, eject_after_failures: 3,
             readmit_backoff_seconds: 5, readmit_backoff_max_seconds: 60,
             max_ejected_percent: 50}
    timeouts: {connect_seconds: 5, first_byte_seconds: 300, idle_stream_seconds: 120}
    limits: {max_body_bytes: 16777216, max_attempts: 3, retry_budget_percent: 20,
             retry_backoff_seconds: 0.025, max_connections: 2048, header_timeout_seconds: 10,
             keepalive_timeout_seconds: 75, large_body_bytes: 1048576, max_large_body_parses: 1}
    admin_token_env: KVROUTER_ADMIN_TOKEN
    auth: {api_keys_file: "", api_keys_env: KVROUTER_API_KEYS}
    forwarding: {client_credentials: false, trust_forwarding_headers: false}
    drain: {grace_seconds: 10}
    engine_metrics:
      enabled: true
      interval_seconds: 0.5
      timeout_seconds: 0.25
      stale_after_intervals: 4
      names:
        running: [vllm:num_requests_running, sglang:num_running_reqs,
                  llamacpp:requests_processing]
        waiting: [vllm:num_requests_waiting, sglang:num_queue_reqs, llamacpp:requests_deferred]
        kv_usage: [vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc, sglang:token_usage,
                   llamacpp:kv_cache_usage_ratio]
    flow_control: {enabled: true, max_queue: 1024, max_wait_seconds: 30,
                   max_inflight_per_engine: 0, priority_reserve: 0,
                   tenant_header: x-kvrouter-tenant,
                   priority_header: x-kvrouter-priority, retry_after_seconds: 1,
                   engine_waiting_threshold: 1, engine_kv_usage_threshold: 0.98}
    gossip: {enabled: false, port: 7946, dns: "", peers: [], secret_env: KVROUTER_GOSSIP_SECRET,
             tls: {cert_file: "", key_file: "", ca_file: ""}, advertise: "", node_id: "",
             preset: lan}

The ``engines`` and ``engine_metrics`` sections live in this package's ``engines``, ``gossip`` in
its ``gossip``; this module composes them with the rest into ``Config`` and re-exports them.

Every section and field is optional. There are no engines by default, and an empty
``engines.dns.name`` means no DNS discovery. Gossip listens on ``listen.host`` at
``gossip.port``; ``gossip.dns`` is NAME:PORT (or NAME, for the gossip port) and each of
``gossip.peers`` is HOST:PORT; an empty ``advertise`` or ``node_id`` is worked out at start
(``router.gateway.replicas.node_config``). Loading is strict like the policy loader
(``router.core.fields``): unknown keys and wrong types are errors that name the file and the
field path. The command-line flags are applied over the file's values by
``router.gateway.config.overrides``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router import presets
from router.core.fields import ConfigError, ConfigFields, parse_yaml, show
from router.gateway.config.engines import (
    DnsEngines,
    EngineMetricsSettings,
    EngineSources,
    KvEventEndpoint,
    KvEventsSettings,
    MetricNames,
    engine_metrics,
    engine_sources,
    engine_url,
)
from router.gateway.config.gossip import (
    GOSSIP_PRESETS,
    GossipSettings,
    GossipTls,
    gossip,
)
from router.gateway.openai.request import LARGE_BODY_BYTES, MAX_LARGE_BODY_PARSES
from router.yaml_files import read_text

# The sections kept in their own modules are part of this module's model.
__all__ = [
    "GOSSIP_PRESETS",
    "Auth",
    "Config",
    "ConfigError",
    "DnsEngines",
    "EngineMetricsSettings",
    "EngineSources",
    "FlowControl",
    "Forwarding",
    "GossipSettings",
    "GossipTls",
    "HealthSettings",
    "KvEventEndpoint",
    "KvEventsSettings",
    "Limits",
    "Listen",
    "MetricNames",
    "PolicyReload",
    "Timeouts",
    "check_ready_to_serve",
    "engine_url",
    "load_config",
    "load_config_text",
    "parse_config",
]

# A server in a pod must listen on every interface to be reachable through its Service.
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # /metrics on a port of its own (0: on the API port): its series carry every engine's URL
    # as a label, which clients of the API need not see, and scrapers need no API access.
    metrics_port: int = 0


@dataclass(frozen=True, slots=True)
class PolicyReload:
    """Poll the policy file for content changes (SIGHUP reloads at once either way)."""

    enabled: bool = True
    interval_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Active probes, and passive ejection after consecutive failures, readmitted with backoff."""

    path: str = "/health"
    interval_seconds: float = 5.0
    timeout_seconds: float = 2.0
    eject_after_failures: int = 3
    readmit_backoff_seconds: float = 5.0
    readmit_backoff_max_seconds: float = 60.0
    # Request-shaped failures (a 5xx or a timeout, which one bad request can cause everywhere)
    # never eject so many engines that more than this share of the fleet is out.
    max_ejected_percent: int = 50


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_seconds: float = 5.0
    # Until the first body byte: long prompts prefill for minutes on a busy engine.
    first_byte_seconds: float = 300.0
    idle_stream_seconds: float = 120.0


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 16 * 1024 * 1024
    max_attempts: int = 3
    # Retries in the last 10 s may be this share of the requests (at least 3): a bad minute
    # cannot multiply the fleet's load.
    retry_budget_percent: float = 20.0
    # Pause before a retry: up to this, doubling per attempt, with full jitter.
    retry_backoff_seconds: float = 0.025
    # Client connections open at once (per process); more are answered 503 and closed. The
    # open-file limit is raised to fit them at start (router.gateway.inbound.connections).
    max_connections: int = 2048
    # From a connection's first byte of a request (or its opening) to the end of the headers:
    # a client trickling its headers (slowloris) is answered 408 and closed.
    header_timeout_seconds: float = 10.0
    # An idle keep-alive connection is closed after this; longer than the 60 s that load
    # balancers commonly keep idle connections, so that they close them first.
    keepalive_timeout_seconds: float = 75.0
    # Bodies above this are parsed in a thread, at most max_large_body_parses at once: a
    # parse costs several times the body's size. The parser's own defaults, with their
    # reasons (router.gateway.openai.request), which engine-sim parses with too.
    large_body_bytes: int = LARGE_BODY_BYTES
    max_large_body_parses: int = MAX_LARGE_BODY_PARSES


@dataclass(frozen=True, slots=True)
class DrainSettings:
    """Stopping (router.gateway.runtime.drain): requests in flight get this long, then are cut."""

    # Below the pod's terminationGracePeriodSeconds, so the cut happens before the SIGKILL.
    grace_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class Forwarding:
    """What of the client's headers reaches engines
    (router.gateway.upstream.headers.engine_headers)."""

    # The client's Authorization and Cookie (its credentials for the gateway, not the engines).
    client_credentials: bool = False
    # The client's Forwarded, X-Real-IP and X-Forwarded-* headers: true only behind a proxy
    # that sets them itself, since any client can write them.
    trust_forwarding_headers: bool = False


@dataclass(frozen=True, slots=True)
class Auth:
    """Client API keys (router.gateway.inbound.auth); none configured: the OpenAI routes are
    open."""

    api_keys_file: str = ""
    api_keys_env: str = "KVROUTER_API_KEYS"


@dataclass(frozen=True, slots=True)
class FlowControl:
    """The bounded wait queue in front of a full fleet (router.gateway.inbound.admission)."""

    enabled: bool = True
    # Requests waiting at most; beyond it a 429. A queue longer than a few seconds of the
    # fleet's throughput only turns 429s into timeouts.
    max_queue: int = 1024
    # Longest wait in the queue before a 429.
    max_wait_seconds: float = 30.0
    # In-flight requests (all replicas) at which an engine counts as full; 0: no cap, an
    # engine is full only when its own metrics say it queues (see router.gateway.inbound.admission).
    max_inflight_per_engine: int = 0
    # Of those, slots per engine only requests of priority below 0 may take: urgent traffic
    # finds a free slot instead of waiting for one (needs max_inflight_per_engine).
    priority_reserve: int = 0
    # Who a request belongs to, for fairness: this header, else the API key, else ``user``.
    tenant_header: str = "x-kvrouter-tenant"
    # Overrides the body's ``priority`` (vLLM's meaning: lower is served first).
    priority_header: str = "x-kvrouter-priority"
    retry_after_seconds: int = 1
    # An engine whose own metrics (engine_metrics) report this many requests waiting inside it
    # is full; 0 ignores the report. Its batch is full when it queues, so new requests are
    # better ordered here, by priority and tenant, than in its FIFO.
    engine_waiting_threshold: int = 1
    # An engine reporting this share of its KV cache in use is full; 0 ignores it.
    engine_kv_usage_threshold: float = 0.98


@dataclass(frozen=True, slots=True)
class Config:
    """Everything ``kvrouter serve`` is configured with."""

    listen: Listen = field(default_factory=Listen)
    policy: str = presets.DEFAULT
    policy_reload: PolicyReload = field(default_factory=PolicyReload)
    engines: EngineSources = field(default_factory=EngineSources)
    health: HealthSettings = field(default_factory=HealthSettings)
    timeouts: Timeouts = field(default_factory=Timeouts)
    limits: Limits = field(default_factory=Limits)
    admin_token_env: str = "KVROUTER_ADMIN_TOKEN"
    gossip: GossipSettings = field(default_factory=GossipSettings)
    engine_metrics: EngineMetricsSettings = field(default_factory=EngineMetricsSettings)
    flow_control: FlowControl = field(default_factory=FlowControl)
    auth: Auth = field(default_factory=Auth)
    forwarding: Forwarding = field(default_factory=Forwarding)
    drain: DrainSettings = field(default_factory=DrainSettings)


def _listen(f: ConfigFields | None) -> Listen:
    d = Listen()
    if f is None:
        return d
    out = Listen(
        f.text("host", d.host),
        f.integer("port", d.port, 0, 65535),
        f.integer("metrics_port", d.metrics_port, 0, 65535),
    )
    f.done()
    return out


def _policy_reload(f: ConfigFields | None) -> PolicyReload:
    d = PolicyReload()
    if f is None:
        return d
    out = PolicyReload(
        f.flag("enabled", d.enabled), f.seconds("interval_seconds", d.interval_seconds)
    )
    f.done()
    return out


def _health(f: ConfigFields | None) -> HealthSettings:
    d = HealthSettings()
    if f is None:
        return d
    path = f.text("path", d.path)
    if not path.startswith("/"):
        f.fail(f.at("path"), f"must start with '/', got {show(path)}")
    out = HealthSettings(
        path=path,
        interval_seconds=f.seconds("interval_seconds", d.interval_seconds),
        timeout_seconds=f.seconds("timeout_seconds", d.timeout_seconds),
        eject_after_failures=f.integer("eject_after_failures", d.eject_after_failures, 1, 1000),
        readmit_backoff_seconds=f.seconds("readmit_backoff_seconds", d.readmit_backoff_seconds),
        readmit_backoff_max_seconds=f.seconds(
            "readmit_backoff_max_seconds", d.readmit_backoff_max_seconds
        ),
        max_ejected_percent=f.integer("max_ejected_percent", d.max_ejected_percent, 0, 100),
    )
    if out.readmit_backoff_max_seconds < out.readmit_backoff_seconds:
        f.fail(f.at("readmit_backoff_max_seconds"), "must not be below readmit_backoff_seconds")
    f.done()
    return out


def _timeouts(f: ConfigFields | None) -> Timeouts:
    d = Timeouts()
    if f is None:
        return d
    out = Timeouts(
        connect_seconds=f.seconds("connect_seconds", d.connect_seconds),
        first_byte_seconds=f.seconds("first_byte_seconds", d.first_byte_seconds),
        idle_stream_seconds=f.seconds("idle_stream_seconds", d.idle_stream_seconds),
    )
    f.done()
    return out


def _limits(f: ConfigFields | None) -> Limits:
    d = Limits()
    if f is None:
        return d
    out = Limits(
        max_body_bytes=f.integer("max_body_bytes", d.max_body_bytes, 1024, 1 << 31),
        max_attempts=f.integer("max_attempts", d.max_attempts, 1, 16),
        retry_budget_percent=f.number("retry_budget_percent", d.retry_budget_percent, 0.0, 100.0),
        retry_backoff_seconds=f.number("retry_backoff_seconds", d.retry_backoff_seconds, 0.0, 10.0),
        max_connections=f.integer("max_connections", d.max_connections, 1, 1_000_000),
        header_timeout_seconds=f.seconds("header_timeout_seconds", d.header_timeout_seconds, 0.1),
        keepalive_timeout_seconds=f.seconds(
            "keepalive_timeout_seconds", d.keepalive_timeout_seconds, 0.1
        ),
        large_body_bytes=f.integer("large_body_bytes", d.large_body_bytes, 0, 1 << 31),
        max_large_body_parses=f.integer("max_large_body_parses", d.max_large_body_parses, 1, 64),
    )
    f.done()
    return out


def _forwarding(f: ConfigFields | None) -> Forwarding:
    d = Forwarding()
    if f is None:
        return d
    out = Forwarding(
        f.flag("client_credentials", d.client_credentials),
        f.flag("trust_forwarding_headers", d.trust_forwarding_headers),
    )
    f.done()
    return out


def _drain(f: ConfigFields | None) -> DrainSettings:
    d = DrainSettings()
    if f is None:
        return d
    out = DrainSettings(f.seconds("grace_seconds", d.grace_seconds, 0.0))
    f.done()
    return out


def _auth(f: ConfigFields | None) -> Auth:
    d = Auth()
    if f is None:
        return d
    out = Auth(f.text("api_keys_file", d.api_keys_file), f.text("api_keys_env", d.api_keys_env))
    f.done()
    return out


def _flow_control(f: ConfigFields | None) -> FlowControl:
    d = FlowControl()
    if f is None:
        return d
    out = FlowControl(
        enabled=f.flag("enabled", d.enabled),
        max_queue=f.integer("max_queue", d.max_queue, 0, 1_000_000),
        max_wait_seconds=f.seconds("max_wait_seconds", d.max_wait_seconds, 0.0),
        max_inflight_per_engine=f.integer(
            "max_inflight_per_engine", d.max_inflight_per_engine, 0, 1_000_000
        ),
        priority_reserve=f.integer("priority_reserve", d.priority_reserve, 0, 1_000_000),
        tenant_header=f.text("tenant_header", d.tenant_header),
        priority_header=f.text("priority_header", d.priority_header),
        retry_after_seconds=f.integer("retry_after_seconds", d.retry_after_seconds, 1, 3600),
        engine_waiting_threshold=f.integer(
            "engine_waiting_threshold", d.engine_waiting_threshold, 0, 1_000_000
        ),
        engine_kv_usage_threshold=f.number(
            "engine_kv_usage_threshold", d.engine_kv_usage_threshold, 0.0, 1.0
        ),
    )
    f.done()
    return out


def parse_config(data: Any, where: str = "<config>") -> Config:
    """Decode a config from parsed YAML; raise ``ConfigError`` naming ``where`` and the field."""
    if data is None:
        data = {}  # an empty file is a config of defaults
    f = ConfigFields(data, "", where)
    if isinstance(data, dict) and "engines" in data and "backends" in data:
        f.fail("backends", "give either 'engines' or its older spelling 'backends', not both")
    d = Config()
    policy = f.text("policy", d.policy) or d.policy
    token_env = f.text("admin_token_env", d.admin_token_env)
    cfg = Config(
        listen=_listen(f.sub("listen")),
        policy=policy,
        policy_reload=_policy_reload(f.sub("policy_reload")),
        engines=engine_sources(f.sub("engines") or f.sub("backends")),
        health=_health(f.sub("health")),
        timeouts=_timeouts(f.sub("timeouts")),
        limits=_limits(f.sub("limits")),
        admin_token_env=token_env,
        gossip=gossip(f.sub("gossip")),
        engine_metrics=engine_metrics(f.sub("engine_metrics")),
        flow_control=_flow_control(f.sub("flow_control")),
        auth=_auth(f.sub("auth")),
        forwarding=_forwarding(f.sub("forwarding")),
        drain=_drain(f.sub("drain")),
    )
    f.done()
    return cfg


def load_config_text(text: str, where: str) -> Config:
    """Parse config YAML text; errors name ``where``."""
    return parse_config(parse_yaml(text, where, ConfigError), where)


def load_config(path: str | Path) -> Config:
    """Read and parse a config file."""
    return load_config_text(read_text(Path(path), ConfigError), str(path))


def check_ready_to_serve(cfg: Config) -> None:
    """Cross-checks that only matter once flags are applied; raises ``ConfigError``."""
    if not cfg.engines.static and cfg.engines.dns is None:
        raise ConfigError(
            "no engines: give --engine URL, --engine-dns NAME:PORT, "
            "or engines.static / engines.dns in the config file"
        )
    if not cfg.listen.host:
        raise ConfigError("listen.host: must not be empty")
    if cfg.listen.metrics_port and cfg.listen.metrics_port == cfg.listen.port:
        raise ConfigError("listen.metrics_port: must differ from the API port (0: share it)")
    kv = cfg.engines.kv_events
    if kv.tokenizer != "engine" and not kv.enabled:
        raise ConfigError(
            f"{cfg.engines.key('kv_events.tokenizer')} (--tokenizer): token ids key only "
            "engines that publish KV events; give --kv-events or --kv-events-port too"
        )
