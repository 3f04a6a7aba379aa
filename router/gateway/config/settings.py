"""The gateway's config file: its model and strict loading.

The file's shape is shared with the Helm chart, so its names are a contract. Every field, with
its default (tests/gateway/config/test_settings.py holds this example to the dataclasses)::

    listen: {host: 0.0.0.0, port: 8000, metrics_port: 0}   # 0: /metrics on the API port
    policy: kv-aware                             # a preset name, or a policy file
    policy_reload: {enabled: true, interval_seconds: 2}
    engines:                                     # or ``backends``, the released spelling
      static: []                        # URLs, or {url: URL, api_key_env: NAME,
                                        #   kind: vllm | sglang,
                                        #   role: prefill | decode | both,
                                        #   bootstrap_port: PORT} entries
      dns: {name: "", port: 8000, scheme: http,  # name: a headless Service's DNS name
            interval_seconds: 10, api_key_env: "", kind: vllm,
            role: both}                 # or a list of them, a name per pool (and their
                                        # bootstrap_port, for SGLang prefill engines)
      models_refresh_seconds: 30
      pods: {selector: "", namespace: "", port: 8000, scheme: http}  # Kubernetes pods by label
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
    forwarding: {client_credentials: false, trust_forwarding_headers: false,
                 engine_error_bodies: reduced}     # or verbatim: engines' 4xx bodies as sent
    drain: {grace_seconds: 10}
    engine_metrics:
      enabled: true
      interval_seconds: 0.5
      timeout_seconds: 0.25
      stale_after_intervals: 4
      learn_capacity: true
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
    models:                                      # hot reloaded (router.gateway.config.models)
      aliases: {}                                # {ALIAS: SERVED_NAME}
      patterns: []                               # [{match: GLOB, model: SERVED_NAME}], in order
    tracing: {enabled: false, endpoint: "", protocol: grpc, sample_ratio: 1.0,
              service_name: kvrouter}    # OTEL_* variables win (router.gateway.config.tracing)
    epp: {port: 0, proxy: true}   # the endpoint picker's gRPC port (0: off); proxy: false
                                  # leaves the HTTP port with health, metrics and admin only
    access_log: {enabled: true, sample: 1.0}       # errors are written whatever the sample
    route_headers: false      # x-kvrouter-engine, x-kvrouter-overlap-tokens on every answer
    disaggregation:           # applies once some engine is prefill or decode
      protocol: vllm          # or sglang (router.gateway.config.disaggregation)
      link_gbps: 100
      kv_bytes_per_token: 131072  # or model: {layers, kv_heads, head_dim, bytes_per_value}
      prefill_tokens_per_s: 10000
      stay_below_tokens: 256
      decode_stall_weight: 1.0
      decider: cost           # or always, threshold (llm-d's rule: threshold_tokens)
      threshold_tokens: 100

This module defines ``listen``, ``policy_reload`` and ``health``, and composes every section into
``Config``. The others live in this package's ``serving`` (how a request is served: ``timeouts``,
``limits``, ``auth``, ``forwarding``, ``drain``, ``flow_control``), ``engines`` (``engines``,
``engine_metrics``), ``gossip``, ``tracing``, ``epp``, ``access_log``, ``disaggregation``
and ``models`` (model
aliases, the one section applied again when the file changes: router.gateway.config.reload).

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

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router import presets
from router.core.disaggregation import DisaggSettings
from router.core.fields import ConfigError, ConfigFields, parse_yaml, show
from router.gateway.config.access_log import AccessLogSettings, access_log
from router.gateway.config.disaggregation import disaggregation
from router.gateway.config.engines import (
    EngineMetricsSettings,
    EngineSources,
    engine_metrics,
    engine_sources,
)
from router.gateway.config.epp import EppSettings, check_epp, epp
from router.gateway.config.gossip import GossipSettings, gossip
from router.gateway.config.models import ModelAliases, models
from router.gateway.config.serving import (
    Auth,
    DrainSettings,
    FlowControl,
    Forwarding,
    Limits,
    Timeouts,
    auth,
    drain,
    flow_control,
    forwarding,
    limits,
    timeouts,
)
from router.gateway.config.tracing import TracingSettings, tracing
from router.yaml_files import read_text

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
    models: ModelAliases = field(default_factory=ModelAliases)
    # The file this config was read from ("": none), for the watcher of its models section.
    source: str = field(default="", compare=False)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    epp: EppSettings = field(default_factory=EppSettings)
    access_log: AccessLogSettings = field(default_factory=AccessLogSettings)
    # Answers name the engine and its believed overlap: off, as engine addresses are internal.
    route_headers: bool = False
    # Prefill/decode disaggregation (router.gateway.config.disaggregation): applies once
    # some engine's role is prefill or decode.
    disaggregation: DisaggSettings = field(default_factory=DisaggSettings)


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
        timeouts=timeouts(f.sub("timeouts")),
        limits=limits(f.sub("limits")),
        admin_token_env=token_env,
        gossip=gossip(f.sub("gossip")),
        engine_metrics=engine_metrics(f.sub("engine_metrics")),
        flow_control=flow_control(f.sub("flow_control")),
        auth=auth(f.sub("auth")),
        forwarding=forwarding(f.sub("forwarding")),
        drain=drain(f.sub("drain")),
        models=models(f.sub("models")),
        tracing=tracing(f.sub("tracing")),
        epp=epp(f.sub("epp")),
        access_log=access_log(f.sub("access_log")),
        route_headers=f.flag("route_headers", d.route_headers),
        disaggregation=disaggregation(f.sub("disaggregation")),
    )
    f.done()
    return cfg


def load_config_text(text: str, where: str) -> Config:
    """Parse config YAML text; errors name ``where``."""
    return parse_config(parse_yaml(text, where, ConfigError), where)


def load_config(path: str | Path) -> Config:
    """Read and parse a config file (its ``source`` is the path)."""
    cfg = load_config_text(read_text(Path(path), ConfigError), str(path))
    return dataclasses.replace(cfg, source=str(path))


def check_ready_to_serve(cfg: Config) -> None:
    """Cross-checks that only matter once flags are applied; raises ``ConfigError``."""
    if not cfg.engines.static and not cfg.engines.dns and cfg.engines.pods is None:
        raise ConfigError(
            "no engines: give --engine URL, --engine-dns NAME:PORT, --engine-pods SELECTOR, "
            "or engines.static / engines.dns / engines.pods in the config file"
        )
    if not cfg.listen.host:
        raise ConfigError("listen.host: must not be empty")
    if cfg.listen.metrics_port and cfg.listen.metrics_port == cfg.listen.port:
        raise ConfigError("listen.metrics_port: must differ from the API port (0: share it)")
    check_epp(cfg.epp, cfg.listen.port)
    kv = cfg.engines.kv_events
    if kv.tokenizer != "engine" and not kv.enabled:
        raise ConfigError(
            f"{cfg.engines.key('kv_events.tokenizer')} (--tokenizer): token ids key only "
            "engines that publish KV events; give --kv-events or --kv-events-port too"
        )
    if (problem := cfg.engines.unmatched_kv_events()) is not None:
        raise ConfigError(problem)
