"""The gateway's config file: its model, strict loading, and command-line overrides.

The file's shape is shared with the Helm chart, so its names are a contract::

    listen: {host: 0.0.0.0, port: 8000}
    policy: /etc/kvrouter/policy/policy.yaml     # a file, or a preset name
    policy_reload: {enabled: true, interval_seconds: 2}
    engines:                                     # or ``backends``, the released spelling
      static: [http://vllm-0.vllm:8000]
      dns: {name: vllm-headless.default.svc.cluster.local, port: 8000, scheme: http,
            interval_seconds: 10}
      models_refresh_seconds: 30
      kv_events: {port: 0, replay_port: 0, topic: "", tokenizer: engine,
                  tokenize_timeout_seconds: 0.5, bridge_seconds: 5,
                  medium_weights: {gpu: 1.0, cpu: 0.5, disk: 0.25},
                  endpoints: {ENGINE_URL: {endpoint: tcp://HOST:PORT,
                                           replay_endpoint: tcp://HOST:PORT}}}
    health: {path: /health, interval_seconds: 5, timeout_seconds: 2, eject_after_failures: 3,
             readmit_backoff_seconds: 5, readmit_backoff_max_seconds: 60,
             max_ejected_percent: 50}
    timeouts: {connect_seconds: 5, first_byte_seconds: 300, idle_stream_seconds: 120}
    limits: {max_body_bytes: 16777216, max_attempts: 3, retry_budget_percent: 20,
             retry_backoff_seconds: 0.025, max_connections: 2048, header_timeout_seconds: 10,
             keepalive_timeout_seconds: 75, large_body_bytes: 1048576, max_large_body_parses: 1}
    admin_token_env: KVROUTER_ADMIN_TOKEN
    auth: {api_keys_file: "", api_keys_env: KVROUTER_API_KEYS}
    engine_metrics: {enabled: true, interval_seconds: 0.5, timeout_seconds: 0.25,
                     stale_after_intervals: 4,
                     names: {running: [...], waiting: [...], kv_usage: [...]}}
    flow_control: {enabled: true, max_queue: 1024, max_wait_seconds: 30,
                   max_inflight_per_engine: 0, priority_reserve: 0,
                   tenant_header: x-kvrouter-tenant,
                   priority_header: x-kvrouter-priority, retry_after_seconds: 1}
    gossip: {enabled: false, port: 7946, dns: "", peers: [], secret_env: KVROUTER_GOSSIP_SECRET,
             tls: {cert_file: "", key_file: "", ca_file: ""}, advertise: "", node_id: "",
             preset: lan}

Every section and field is optional; defaults are the values above, except that there are no
engines by default. Gossip listens on ``listen.host`` at ``gossip.port``; ``gossip.dns`` is
NAME:PORT (or NAME, for the gossip port) and each of ``gossip.peers`` is HOST:PORT; an empty
``advertise`` or ``node_id`` is worked out at start (``router.gateway.replicas``). Loading is strict
like the policy loader (``router.core.fields``): unknown keys and wrong types are errors that
name the file and the field path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from router import hostport
from router.core.fields import ConfigError, Fields, parse_yaml, read_yaml_file, show
from router.presets import DEFAULT as DEFAULT_POLICY

# A server in a pod must listen on every interface to be reachable through its Service.
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
DAY = 86_400.0


class _Fields(Fields):
    error = ConfigError


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT


@dataclass(frozen=True, slots=True)
class PolicyReload:
    """Poll the policy file for content changes (SIGHUP reloads at once either way)."""

    enabled: bool = True
    interval_seconds: float = 2.0


@dataclass(frozen=True, slots=True)
class DnsEngines:
    """Every address of ``name`` is an engine ``scheme://address:port``; re-resolved."""

    name: str
    port: int = 8000
    scheme: str = "http"
    interval_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class KvEventEndpoint:
    """Where one engine publishes its KV cache events, and where it replays them."""

    endpoint: str
    replay_endpoint: str = ""


@dataclass(frozen=True, slots=True)
class KvEvents:
    """Engines' KV cache events (router.gateway.kv_events): a port rule and explicit endpoints.

    ``port`` (0: no rule) applies to every engine's host; ``endpoints`` name engines one by
    one and win over the rule. ``tokenizer: engine`` asks a precise engine's ``/tokenize``.
    """

    port: int = 0
    replay_port: int = 0
    topic: str = ""
    endpoints: Mapping[str, KvEventEndpoint] = field(default_factory=dict)
    tokenizer: str = "engine"
    tokenize_timeout_seconds: float = 0.5
    bridge_seconds: float = 5.0
    medium_weights: Mapping[str, float] = field(
        default_factory=lambda: {"gpu": 1.0, "cpu": 0.5, "disk": 0.25}
    )

    @property
    def enabled(self) -> bool:
        return bool(self.port or self.endpoints)


@dataclass(frozen=True, slots=True)
class EngineSources:
    static: tuple[str, ...] = ()
    dns: DnsEngines | None = None
    models_refresh_seconds: float = 30.0
    kv_events: KvEvents = field(default_factory=KvEvents)


@dataclass(frozen=True, slots=True)
class Health:
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
    # open-file limit is raised to fit them at start (router.gateway.connections).
    max_connections: int = 2048
    # From a connection's first byte of a request (or its opening) to the end of the headers:
    # a client trickling its headers (slowloris) is answered 408 and closed.
    header_timeout_seconds: float = 10.0
    # An idle keep-alive connection is closed after this; longer than the 60 s that load
    # balancers commonly keep idle connections, so that they close them first.
    keepalive_timeout_seconds: float = 75.0
    # Bodies above this are parsed in a thread, at most max_large_body_parses at once: a
    # parse costs several times the body's size (router.gateway.inbound).
    large_body_bytes: int = 1024 * 1024
    max_large_body_parses: int = 1


@dataclass(frozen=True, slots=True)
class GossipTls:
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    @property
    def configured(self) -> bool:
        """Any of the files is set (then all three must be)."""
        return bool(self.cert_file or self.key_file or self.ca_file)


# Gossip timing presets (router.gossip.config.PRESETS): lan for a cluster, local for one host.
GOSSIP_PRESETS = ("lan", "local")


@dataclass(frozen=True, slots=True)
class Gossip:
    """Sharing of index deltas and in-flight load with the other router replicas."""

    enabled: bool = False
    port: int = 7946
    dns: str = ""
    peers: tuple[str, ...] = ()
    secret_env: str = "KVROUTER_GOSSIP_SECRET"
    tls: GossipTls = field(default_factory=GossipTls)
    # HOST:PORT that peers dial; empty: worked out from the listen address or the pod's IP.
    advertise: str = ""
    # This replica's name among its peers; empty: the pod name, or hostname:port.
    node_id: str = ""
    preset: str = "lan"


@dataclass(frozen=True, slots=True)
class Auth:
    """Client API keys (router.gateway.auth); none configured: the OpenAI routes are open."""

    api_keys_file: str = ""
    api_keys_env: str = "KVROUTER_API_KEYS"


@dataclass(frozen=True, slots=True)
class FlowControl:
    """The bounded wait queue in front of a full fleet (router.gateway.flow)."""

    enabled: bool = True
    # Requests waiting at most; beyond it a 429. A queue longer than a few seconds of the
    # fleet's throughput only turns 429s into timeouts.
    max_queue: int = 1024
    # Longest wait in the queue before a 429.
    max_wait_seconds: float = 30.0
    # In-flight requests (all replicas) at which an engine counts as full; 0: no cap, an
    # engine is full only when its own metrics say it queues (see router.gateway.flow).
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
class MetricNames:
    """Which /metrics series carry an engine's load (router.gateway.engine_metrics).

    For each figure the first name an engine exports is used; samples of it under several
    label sets (model_name, a data-parallel rank's engine="0") are summed (KV use: the
    highest). The defaults cover vLLM (and its older KV name), SGLang and llama.cpp.
    """

    running: tuple[str, ...] = (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    )
    waiting: tuple[str, ...] = (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    )
    kv_usage: tuple[str, ...] = (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    )


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Scraping the engines' own load from their Prometheus /metrics."""

    enabled: bool = True
    # vLLM refreshes its gauges every scheduler step; half a second keeps a report younger
    # than a typical prefill while costing each engine two small GETs a second.
    interval_seconds: float = 0.5
    # A scrape slower than this is dropped (the last report ages out instead of blocking).
    timeout_seconds: float = 0.25
    # A report older than this many intervals is ignored: the router's own figures stand.
    stale_after_intervals: int = 4
    names: MetricNames = field(default_factory=MetricNames)

    @property
    def stale_after_seconds(self) -> float:
        return self.interval_seconds * self.stale_after_intervals


@dataclass(frozen=True, slots=True)
class Config:
    """Everything ``kvrouter serve`` is configured with."""

    listen: Listen = field(default_factory=Listen)
    policy: str = DEFAULT_POLICY
    policy_reload: PolicyReload = field(default_factory=PolicyReload)
    engines: EngineSources = field(default_factory=EngineSources)
    health: Health = field(default_factory=Health)
    timeouts: Timeouts = field(default_factory=Timeouts)
    limits: Limits = field(default_factory=Limits)
    admin_token_env: str = "KVROUTER_ADMIN_TOKEN"
    gossip: Gossip = field(default_factory=Gossip)
    engine_metrics: EngineMetrics = field(default_factory=EngineMetrics)
    flow_control: FlowControl = field(default_factory=FlowControl)
    auth: Auth = field(default_factory=Auth)


def engine_url(text: str) -> str:
    """An engine base URL in canonical form; raises ``ValueError`` saying why.

    The URL is the engine's name in the index that replicas gossip, so every spelling of one
    engine must give one name: lower-case scheme and host, IP literals compressed, the port
    always explicit (as DNS discovery writes it), no trailing slash.
    """
    try:
        u = urlsplit(text.strip())
        port = u.port
    except ValueError as e:
        raise ValueError(f"not a URL: {text!r} ({e})") from None
    if u.scheme not in SCHEMES:
        raise ValueError(f"must start with http:// or https://, got {text!r}")
    if not u.hostname:
        raise ValueError(f"has no host: {text!r}")
    if u.query or u.fragment or u.username or u.password:
        raise ValueError(f"must not carry a query, fragment or credentials: {text!r}")
    host = u.hostname
    with contextlib.suppress(ValueError):
        host = ipaddress.ip_address(host).compressed
    if ":" in host:
        host = f"[{host}]"
    port = DEFAULT_PORTS[u.scheme] if port is None else port
    return f"{u.scheme}://{host}:{port}{u.path.rstrip('/')}"


def dns_target(text: str) -> tuple[str, int]:
    """``NAME:PORT`` -> (name, port); raises ``ValueError`` saying why."""
    return hostport.split(text)


def gossip_peer(text: str) -> str:
    """A gossip seed, ``HOST:PORT`` (``[V6]:PORT``), stripped; raises ``ValueError``."""
    hostport.split(text)
    return text.strip()


def gossip_dns(text: str) -> str:
    """A gossip DNS name, ``NAME:PORT`` or ``NAME`` (the gossip port); raises ``ValueError``."""
    text = text.strip()
    if ":" in text and not text.endswith("]"):
        hostport.split(text)
    elif not text.strip("[]"):
        raise ValueError("must be NAME:PORT or NAME, got an empty name")
    return text


def _seconds(f: _Fields, key: str, default: float, lo: float = 0.01) -> float:
    return f.number(key, default, lo, DAY)


def _listen(f: _Fields | None) -> Listen:
    if f is None:
        return Listen()
    out = Listen(f.text("host", DEFAULT_HOST), f.integer("port", DEFAULT_PORT, 0, 65535))
    f.done()
    return out


def _policy_reload(f: _Fields | None) -> PolicyReload:
    if f is None:
        return PolicyReload()
    out = PolicyReload(f.flag("enabled", True), _seconds(f, "interval_seconds", 2.0))
    f.done()
    return out


def zmq_endpoint(text: str) -> str:
    """``tcp://HOST:PORT``, checked; raises ``ValueError`` saying why."""
    if not text.startswith("tcp://"):
        raise ValueError(f"must be tcp://HOST:PORT, got {text!r}")
    hostport.split(text.removeprefix("tcp://"))
    return text


def _kv_events(f: _Fields | None) -> KvEvents:
    if f is None:
        return KvEvents()
    endpoints: dict[str, KvEventEndpoint] = {}
    e = f.sub("endpoints")
    if e is not None:
        for url in list(e.data):
            sub = e.sub(str(url))
            where = e.at(str(url))
            if sub is None:
                e.fail(where, "must be {endpoint: tcp://HOST:PORT, replay_endpoint: ...}")
            ep, replay = sub.text("endpoint", "", required=True), sub.text("replay_endpoint", "")
            try:
                key = engine_url(str(url))
                zmq_endpoint(ep)
                if replay:
                    zmq_endpoint(replay)
            except ValueError as err:
                e.fail(where, str(err))
            sub.done()
            endpoints[key] = KvEventEndpoint(ep, replay)
        e.done()
    weights: dict[str, float] = {"gpu": 1.0, "cpu": 0.5, "disk": 0.25}
    w = f.sub("medium_weights")
    if w is not None:
        weights = {str(k).lower(): w.number(str(k), 1.0, 0.0, 1.0) for k in list(w.data)}
        w.done()
    tokenizer = f.text("tokenizer", "engine")
    if tokenizer != "engine":
        f.fail(f.at("tokenizer"), "only 'engine' (the engine's POST /tokenize) is supported")
    out = KvEvents(
        port=f.integer("port", 0, 0, 65535),
        replay_port=f.integer("replay_port", 0, 0, 65535),
        topic=f.text("topic", ""),
        endpoints=endpoints,
        tokenizer=tokenizer,
        tokenize_timeout_seconds=_seconds(f, "tokenize_timeout_seconds", 0.5, 0.001),
        bridge_seconds=_seconds(f, "bridge_seconds", 5.0, 0.0),
        medium_weights=weights,
    )
    f.done()
    return out


def _engine_sources(f: _Fields | None) -> EngineSources:
    if f is None:
        return EngineSources()
    static: list[str] = []
    for i, text in enumerate(f.texts("static")):
        try:
            static.append(engine_url(text))
        except ValueError as e:
            f.fail(f"{f.at('static')}[{i}]", str(e))
    dns: DnsEngines | None = None
    d = f.sub("dns")
    if d is not None:
        name = d.text("name", "")
        dns = DnsEngines(
            name=name,
            port=d.integer("port", 8000, 1, 65535),
            scheme=d.choice("scheme", "http", SCHEMES),
            interval_seconds=_seconds(d, "interval_seconds", 10.0, 0.1),
        )
        d.done()
        if not name:
            dns = None  # an empty name (the chart's default) means no DNS discovery
    out = EngineSources(
        tuple(static),
        dns,
        _seconds(f, "models_refresh_seconds", 30.0, 0.1),
        _kv_events(f.sub("kv_events")),
    )
    f.done()
    return out


def _health(f: _Fields | None) -> Health:
    if f is None:
        return Health()
    path = f.text("path", "/health")
    if not path.startswith("/"):
        f.fail(f.at("path"), f"must start with '/', got {show(path)}")
    out = Health(
        path=path,
        interval_seconds=_seconds(f, "interval_seconds", 5.0),
        timeout_seconds=_seconds(f, "timeout_seconds", 2.0),
        eject_after_failures=f.integer("eject_after_failures", 3, 1, 1000),
        readmit_backoff_seconds=_seconds(f, "readmit_backoff_seconds", 5.0),
        readmit_backoff_max_seconds=_seconds(f, "readmit_backoff_max_seconds", 60.0),
        max_ejected_percent=f.integer("max_ejected_percent", 50, 0, 100),
    )
    if out.readmit_backoff_max_seconds < out.readmit_backoff_seconds:
        f.fail(f.at("readmit_backoff_max_seconds"), "must not be below readmit_backoff_seconds")
    f.done()
    return out


def _timeouts(f: _Fields | None) -> Timeouts:
    if f is None:
        return Timeouts()
    out = Timeouts(
        connect_seconds=_seconds(f, "connect_seconds", 5.0),
        first_byte_seconds=_seconds(f, "first_byte_seconds", 300.0),
        idle_stream_seconds=_seconds(f, "idle_stream_seconds", 120.0),
    )
    f.done()
    return out


def _limits(f: _Fields | None) -> Limits:
    if f is None:
        return Limits()
    out = Limits(
        max_body_bytes=f.integer("max_body_bytes", 16 * 1024 * 1024, 1024, 1 << 31),
        max_attempts=f.integer("max_attempts", 3, 1, 16),
        retry_budget_percent=f.number("retry_budget_percent", 20.0, 0.0, 100.0),
        retry_backoff_seconds=f.number("retry_backoff_seconds", 0.025, 0.0, 10.0),
        max_connections=f.integer("max_connections", 2048, 1, 1_000_000),
        header_timeout_seconds=_seconds(f, "header_timeout_seconds", 10.0, 0.1),
        keepalive_timeout_seconds=_seconds(f, "keepalive_timeout_seconds", 75.0, 0.1),
        large_body_bytes=f.integer("large_body_bytes", 1024 * 1024, 0, 1 << 31),
        max_large_body_parses=f.integer("max_large_body_parses", 1, 1, 64),
    )
    f.done()
    return out


def _auth(f: _Fields | None) -> Auth:
    if f is None:
        return Auth()
    out = Auth(f.text("api_keys_file", ""), f.text("api_keys_env", "KVROUTER_API_KEYS"))
    f.done()
    return out


def _flow_control(f: _Fields | None) -> FlowControl:
    if f is None:
        return FlowControl()
    out = FlowControl(
        enabled=f.flag("enabled", True),
        max_queue=f.integer("max_queue", 1024, 0, 1_000_000),
        max_wait_seconds=_seconds(f, "max_wait_seconds", 30.0, 0.0),
        max_inflight_per_engine=f.integer("max_inflight_per_engine", 0, 0, 1_000_000),
        priority_reserve=f.integer("priority_reserve", 0, 0, 1_000_000),
        tenant_header=f.text("tenant_header", "x-kvrouter-tenant"),
        priority_header=f.text("priority_header", "x-kvrouter-priority"),
        retry_after_seconds=f.integer("retry_after_seconds", 1, 1, 3600),
        engine_waiting_threshold=f.integer("engine_waiting_threshold", 1, 0, 1_000_000),
        engine_kv_usage_threshold=f.number("engine_kv_usage_threshold", 0.98, 0.0, 1.0),
    )
    f.done()
    return out


def _metric_names(f: _Fields | None) -> MetricNames:
    d = MetricNames()
    if f is None:
        return d
    out = MetricNames(
        **{
            key: tuple(f.texts(key)) if f.has(key) else getattr(d, key)
            for key in ("running", "waiting", "kv_usage")
        }
    )
    f.done()
    return out


def _engine_metrics(f: _Fields | None) -> EngineMetrics:
    if f is None:
        return EngineMetrics()
    out = EngineMetrics(
        enabled=f.flag("enabled", True),
        interval_seconds=_seconds(f, "interval_seconds", 0.5),
        timeout_seconds=_seconds(f, "timeout_seconds", 0.25),
        stale_after_intervals=f.integer("stale_after_intervals", 4, 1, 1000),
        names=_metric_names(f.sub("names")),
    )
    f.done()
    return out


def _gossip(f: _Fields | None) -> Gossip:
    if f is None:
        return Gossip()
    tls = GossipTls()
    t = f.sub("tls")
    if t is not None:
        tls = GossipTls(t.text("cert_file", ""), t.text("key_file", ""), t.text("ca_file", ""))
        t.done()
    peers: list[str] = []
    for i, text in enumerate(f.texts("peers")):
        try:
            peers.append(gossip_peer(text))
        except ValueError as e:
            f.fail(f"{f.at('peers')}[{i}]", str(e))
    dns = f.text("dns", "")
    advertise = f.text("advertise", "")
    for key, value, check in (("dns", dns, gossip_dns), ("advertise", advertise, gossip_peer)):
        if value:
            try:
                check(value)
            except ValueError as e:
                f.fail(f.at(key), str(e))
    out = Gossip(
        enabled=f.flag("enabled", False),
        port=f.integer("port", 7946, 1, 65535),
        dns=dns.strip(),
        peers=tuple(peers),
        secret_env=f.text("secret_env", "KVROUTER_GOSSIP_SECRET"),
        tls=tls,
        advertise=advertise.strip(),
        node_id=f.text("node_id", ""),
        preset=f.choice("preset", "lan", GOSSIP_PRESETS),
    )
    f.done()
    return out


def parse_config(data: Any, where: str = "<config>") -> Config:
    """Decode a config from parsed YAML; raise ``ConfigError`` naming ``where`` and the field."""
    if data is None:
        data = {}  # an empty file is a config of defaults
    f = _Fields(data, "", where)
    if isinstance(data, dict) and "engines" in data and "backends" in data:
        f.fail("backends", "give either 'engines' or its older spelling 'backends', not both")
    policy = f.text("policy", DEFAULT_POLICY) or DEFAULT_POLICY
    token_env = f.text("admin_token_env", "KVROUTER_ADMIN_TOKEN")
    cfg = Config(
        listen=_listen(f.sub("listen")),
        policy=policy,
        policy_reload=_policy_reload(f.sub("policy_reload")),
        engines=_engine_sources(f.sub("engines") or f.sub("backends")),
        health=_health(f.sub("health")),
        timeouts=_timeouts(f.sub("timeouts")),
        limits=_limits(f.sub("limits")),
        admin_token_env=token_env,
        gossip=_gossip(f.sub("gossip")),
        engine_metrics=_engine_metrics(f.sub("engine_metrics")),
        flow_control=_flow_control(f.sub("flow_control")),
        auth=_auth(f.sub("auth")),
    )
    f.done()
    return cfg


def load_config_text(text: str, where: str) -> Config:
    """Parse config YAML text; errors name ``where``."""
    return parse_config(parse_yaml(text, where, ConfigError), where)


def load_config(path: str | Path) -> Config:
    """Read and parse a config file."""
    data, where = read_yaml_file(path, ConfigError)
    return parse_config(data, where)


def with_overrides(
    cfg: Config,
    *,
    engines: list[str] | None = None,
    engine_dns: str | None = None,
    policy: str | None = None,
    host: str | None = None,
    port: int | None = None,
    gossip_port: int | None = None,
    gossip_peers: list[str] | None = None,
    gossip_dns: str | None = None,
    gossip_advertise: str | None = None,
    gossip_node_id: str | None = None,
    gossip_preset: str | None = None,
) -> Config:
    """``cfg`` with command-line flags applied (a flag replaces the file's value)."""
    b = cfg.engines
    if engines:
        urls: list[str] = []
        for text in engines:
            try:
                urls.append(engine_url(text))
            except ValueError as e:
                raise ConfigError(f"--engine: {e}") from None
        b = dataclasses.replace(b, static=tuple(urls))
    if engine_dns:
        try:
            name, dport = dns_target(engine_dns)
        except ValueError as e:
            raise ConfigError(f"--engine-dns: {e}") from None
        old = b.dns or DnsEngines(name)
        b = dataclasses.replace(b, dns=dataclasses.replace(old, name=name, port=dport))
    listen = cfg.listen
    if host is not None:
        listen = dataclasses.replace(listen, host=host)
    if port is not None:
        listen = dataclasses.replace(listen, port=port)
    gossip = _gossip_overrides(
        cfg.gossip,
        port=gossip_port,
        peers=gossip_peers,
        dns=gossip_dns,
        advertise=gossip_advertise,
        node_id=gossip_node_id,
        preset=gossip_preset,
    )
    return dataclasses.replace(
        cfg, engines=b, listen=listen, policy=policy or cfg.policy, gossip=gossip
    )


def _gossip_overrides(
    g: Gossip,
    *,
    port: int | None,
    peers: list[str] | None,
    dns: str | None,
    advertise: str | None,
    node_id: str | None,
    preset: str | None,
) -> Gossip:
    """The gossip flags applied: ``--gossip-port`` turns gossip on; the others need it on."""
    if port is not None:
        if not 0 < port < 65536:
            raise ConfigError(f"--gossip-port: must be from 1 to 65535, got {port}")
        g = dataclasses.replace(g, enabled=True, port=port)
    given = {
        "--gossip-peer": peers,
        "--gossip-dns": dns,
        "--gossip-advertise": advertise,
        "--gossip-node-id": node_id,
        "--gossip-preset": preset,
    }
    used = [flag for flag, value in given.items() if value]
    if used and not g.enabled:
        raise ConfigError(
            f"{used[0]} needs gossip on: give --gossip-port P (or gossip.enabled in the config)"
        )
    if peers:
        seeds = tuple(_flag("--gossip-peer", gossip_peer, p) for p in peers)
        g = dataclasses.replace(g, peers=seeds)
    if dns:
        g = dataclasses.replace(g, dns=_flag("--gossip-dns", gossip_dns, dns))
    if advertise:
        g = dataclasses.replace(g, advertise=_flag("--gossip-advertise", gossip_peer, advertise))
    if node_id:
        g = dataclasses.replace(g, node_id=node_id)
    if preset:
        g = dataclasses.replace(g, preset=preset)
    return g


def _flag(flag: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except ValueError as e:
        raise ConfigError(f"{flag}: {e}") from None


def check_ready_to_serve(cfg: Config) -> None:
    """Cross-checks that only matter once flags are applied; raises ``ConfigError``."""
    if not cfg.engines.static and cfg.engines.dns is None:
        raise ConfigError(
            "no engines: give --engine URL, --engine-dns NAME:PORT, "
            "or engines.static / engines.dns in the config file"
        )
    if not cfg.listen.host:
        raise ConfigError("listen.host: must not be empty")


def with_kv_events(
    cfg: Config,
    *,
    endpoints: list[str] | None = None,
    port: int | None = None,
    replay_port: int | None = None,
    tokenizer: str | None = None,
) -> Config:
    """``cfg`` with the KV-event flags applied (``--kv-events URL=tcp://H:P[,tcp://H:R]``)."""
    kv = cfg.engines.kv_events
    if endpoints:
        eps = dict(kv.endpoints)
        for spec in endpoints:
            url, sep, rest = spec.partition("=")
            ep, _, replay = rest.partition(",")
            try:
                if not sep:
                    raise ValueError(f"must be ENGINE_URL=tcp://HOST:PORT, got {spec!r}")
                key = engine_url(url)
                zmq_endpoint(ep)
                if replay:
                    zmq_endpoint(replay)
            except ValueError as e:
                raise ConfigError(f"--kv-events: {e}") from None
            eps[key] = KvEventEndpoint(ep, replay)
        kv = dataclasses.replace(kv, endpoints=eps)
    for flag, value in (("--kv-events-port", port), ("--kv-events-replay-port", replay_port)):
        if value is not None and not 0 < value < 65536:
            raise ConfigError(f"{flag}: must be from 1 to 65535, got {value}")
    if port is not None:
        kv = dataclasses.replace(kv, port=port)
    if replay_port is not None:
        kv = dataclasses.replace(kv, replay_port=replay_port)
    if tokenizer is not None:
        if tokenizer != "engine":
            raise ConfigError("--tokenizer: only 'engine' (the engine's POST /tokenize) works")
        kv = dataclasses.replace(kv, tokenizer=tokenizer)
    return dataclasses.replace(cfg, engines=dataclasses.replace(cfg.engines, kv_events=kv))
