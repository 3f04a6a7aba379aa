"""Where the engines are and how the gateway observes them: the ``engines`` section
(static URLs, DNS names, KV-event endpoints) and ``engine_metrics`` (scraping the engines'
own load), with their strict parsers and the URL and endpoint syntax they accept.

Each engine has a kind (how it takes an abort), a role (``prefill``, ``decode`` or ``both``:
router.core.disaggregation) and, for an SGLang prefill engine, its bootstrap port: a static
entry's own, else those of the DNS name that found it (``engines.dns`` is one name or a list,
a name per pool), else the defaults (vllm, both, none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from router import hostport
from router.core.disaggregation import ROLES, Role
from router.core.fields import ConfigFields, show
from router.core.precise import DEFAULT_BRIDGE_SECONDS, DEFAULT_MEDIUM_WEIGHTS
from router.gateway.config.pods import PodEngines, pod_engines

SCHEMES = ("http", "https")
# How an engine is told that a request's client has gone (router.gateway.upstream.abort):
# vllm, a closed connection (vLLM, llama.cpp, TGI); sglang, that and POST /abort_request.
ENGINE_KINDS = ("vllm", "sglang")


DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class DnsEngines:
    """Every address of ``name`` is an engine ``scheme://address:port``; re-resolved."""

    name: str
    port: int = 8000
    scheme: str = "http"
    interval_seconds: float = 10.0
    # The variable holding these engines' API key; empty: the section's ``api_key_env``.
    api_key_env: str = ""
    kind: str = "vllm"  # one of ENGINE_KINDS, for every address of the name
    role: Role = "both"  # for every address of the name (router.core.disaggregation)
    # SGLang prefill engines' bootstrap port, the same on every address; None: unknown.
    bootstrap_port: int | None = None

    @property
    def source(self) -> str:
        """The discovery source the pool files this name's engines under."""
        return f"dns:{self.name}"


@dataclass(frozen=True, slots=True)
class KvEventEndpoint:
    """Where one engine publishes its KV cache events, and where it replays them."""

    endpoint: str
    replay_endpoint: str = ""


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    """Engines' KV cache events (router.gateway.precise.kv_events): a port rule and explicit
    endpoints.

    ``port`` (0: no rule) applies to every engine's host; ``endpoints`` name engines one by
    one and win over the rule. ``tokenizer: engine`` asks a precise engine's ``/tokenize``;
    a path names the model's tokenizer files (router.local_tokenizer).
    """

    port: int = 0
    replay_port: int = 0
    topic: str = ""
    endpoints: Mapping[str, KvEventEndpoint] = field(default_factory=dict)
    tokenizer: str = "engine"
    tokenize_timeout_seconds: float = 0.5
    # The core's own defaults (router.core.precise), where their reasons are given.
    bridge_seconds: float = DEFAULT_BRIDGE_SECONDS
    medium_weights: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MEDIUM_WEIGHTS)
    )

    @property
    def enabled(self) -> bool:
        return bool(self.port or self.endpoints)


def tokenizer_problem(tokenizer: str) -> str | None:
    """What is wrong with a ``tokenizer`` setting (``engine``, or a path), or None.

    A path is read when the gateway starts (where it is mounted), not when a config is parsed.
    """
    if tokenizer.strip():
        return None
    return "must be 'engine' (the engine's POST /tokenize) or the path of the model's tokenizer"


@dataclass(frozen=True, slots=True)
class EngineSources:
    static: tuple[str, ...] = ()
    dns: tuple[DnsEngines, ...] = ()
    models_refresh_seconds: float = 30.0
    kv_events: KvEventsSettings = field(default_factory=KvEventsSettings)
    # Environment variables holding the API keys engines are sent
    # (router.gateway.config.engine_keys): this one for every engine without its own, and per
    # static URL.
    api_key_env: str = ""
    static_key_envs: Mapping[str, str] = field(default_factory=dict)
    # Static engines of a kind other than vllm (ENGINE_KINDS), of a role other than both,
    # and with a bootstrap port, by URL.
    static_kinds: Mapping[str, str] = field(default_factory=dict)
    static_roles: Mapping[str, Role] = field(default_factory=dict)
    static_bootstrap_ports: Mapping[str, int] = field(default_factory=dict)
    # The key the file gave this section (engines, or the released spelling backends), so that
    # messages about it name what the user wrote; two spellings of one setup are equal.
    section: str = field(default="engines", compare=False)
    # Kubernetes pods picked by a label selector (router.gateway.config.pods); None: none.
    pods: PodEngines | None = None

    def key(self, path: str) -> str:
        """The full key of ``path`` in this section as the file spells it."""
        return f"{self.section}.{path}"

    def unmatched_kv_events(self) -> str | None:
        """What is wrong when explicit KV-event endpoints name no static engine, or None.

        An endpoint is keyed by its engine's URL, compared in canonical form: one that names no
        engine would silently subscribe nobody (``localhost`` is not ``127.0.0.1``). With DNS
        discovery the engines' URLs are known only once resolved, so any key may be one.
        """
        if self.dns:
            return None
        lost = sorted(set(self.kv_events.endpoints) - set(self.static))
        if not lost:
            return None
        port = {url: urlsplit(url).port for url in self.static}
        parts = []
        for url in lost:
            near = [e for e, p in port.items() if p == urlsplit(url).port] or list(self.static)
            parts.append(f"{url} (engines: {', '.join(near)})")
        return (
            f"{self.key('kv_events.endpoints')} (--kv-events): no engine has the URL "
            + "; ".join(parts)
        )

    def _dns_of(self, source: str) -> DnsEngines | None:
        for d in self.dns:
            if d.source == source:
                return d
        return None

    def kind_of(self, url: str, source: str = "static") -> str:
        """The kind of the engine at ``url`` found by ``source`` (ENGINE_KINDS)."""
        if url in self.static:
            return self.static_kinds.get(url, "vllm")
        d = self._dns_of(source)
        return d.kind if d is not None else "vllm"

    def role_of(self, url: str, source: str = "static") -> Role:
        """The role of the engine at ``url`` found by ``source`` (router.core.disaggregation)."""
        if url in self.static:
            return self.static_roles.get(url, "both")
        d = self._dns_of(source)
        return d.role if d is not None else "both"

    def bootstrap_port_of(self, url: str, source: str = "static") -> int | None:
        """The SGLang bootstrap port of the engine at ``url`` (None: unknown)."""
        if url in self.static:
            return self.static_bootstrap_ports.get(url)
        d = self._dns_of(source)
        return d.bootstrap_port if d is not None else None

    @property
    def disaggregated(self) -> bool:
        """Some engine has a role other than both."""
        return bool(self.static_roles) or any(d.role != "both" for d in self.dns)


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Which /metrics series carry an engine's load (router.gateway.fleet.scrape).

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
class EngineMetricsSettings:
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
    # The engines' own cache size (vLLM's cache_config_info, SGLang's max_total_num_tokens)
    # replaces the policy's index.engine_capacity_tokens for each engine that reports it.
    learn_capacity: bool = True

    @property
    def stale_after_seconds(self) -> float:
        return self.interval_seconds * self.stale_after_intervals


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


def zmq_endpoint(text: str) -> str:
    """``tcp://HOST:PORT``, checked; raises ``ValueError`` saying why."""
    if not text.startswith("tcp://"):
        raise ValueError(f"must be tcp://HOST:PORT, got {text!r}")
    hostport.split(text.removeprefix("tcp://"))
    return text


def _kv_events(f: ConfigFields | None) -> KvEventsSettings:
    d = KvEventsSettings()
    if f is None:
        return d
    endpoints: dict[str, KvEventEndpoint] = {}
    e = f.sub("endpoints")
    if e is not None:
        for url in list(e.data):
            sub = e.sub(str(url))
            where = e.at(str(url))
            if sub is None:
                e.fail(where, "must be {endpoint: tcp://HOST:PORT, replay_endpoint: ...}")
            ep = sub.text("endpoint", "", required=True)
            replay = sub.text("replay_endpoint", KvEventEndpoint(ep).replay_endpoint)
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
    weights = dict(d.medium_weights)
    w = f.sub("medium_weights")
    if w is not None:
        # A medium named without a weight counts fully, like the GPU.
        weights = {str(k).lower(): w.number(str(k), 1.0, 0.0, 1.0) for k in list(w.data)}
        w.done()
    tokenizer = f.text("tokenizer", d.tokenizer)
    if (problem := tokenizer_problem(tokenizer)) is not None:
        f.fail(f.at("tokenizer"), problem)
    out = KvEventsSettings(
        port=f.integer("port", d.port, 0, 65535),
        replay_port=f.integer("replay_port", d.replay_port, 0, 65535),
        topic=f.text("topic", d.topic),
        endpoints=endpoints,
        tokenizer=tokenizer,
        tokenize_timeout_seconds=f.seconds(
            "tokenize_timeout_seconds", d.tokenize_timeout_seconds, 0.001
        ),
        bridge_seconds=f.seconds("bridge_seconds", d.bridge_seconds, 0.0),
        medium_weights=weights,
    )
    f.done()
    return out


def _static(f: ConfigFields) -> EngineSources:
    """``engines.static``: URLs, or ``{url, api_key_env, kind, role, bootstrap_port}``."""
    static: list[str] = []
    key_envs: dict[str, str] = {}
    kinds: dict[str, str] = {}
    roles: dict[str, Role] = {}
    ports: dict[str, int] = {}
    for i, entry in enumerate(f.values("static")):
        where = f"{f.at('static')}[{i}]"
        text, key_env, kind, role, port = entry, "", "vllm", "both", 0
        if isinstance(entry, Mapping):
            e = ConfigFields(entry, where, f.where)
            text, key_env = e.text("url", "", required=True), e.text("api_key_env", "")
            kind = e.choice("kind", kind, ENGINE_KINDS)
            role = e.choice("role", role, ROLES)
            port = e.integer("bootstrap_port", 0, 1, 65535) if e.has("bootstrap_port") else 0
            e.done()
        elif not isinstance(entry, str):
            f.fail(
                where,
                f"must be a URL or {{url: URL, role: ROLE, kind: KIND}}, got {show(entry)}",
            )
        try:
            url = engine_url(text)
        except ValueError as err:
            f.fail(where, str(err))
        if url in static:
            f.fail(where, f"{url} is listed twice")
        static.append(url)
        if key_env:
            key_envs[url] = key_env
        if kind != "vllm":
            kinds[url] = kind
        if role != "both":
            roles[url] = role  # type: ignore[assignment]
        if port:
            ports[url] = port
    return EngineSources(
        tuple(static),
        static_key_envs=key_envs,
        static_kinds=kinds,
        static_roles=roles,
        static_bootstrap_ports=ports,
    )


def _dns_name(sub: ConfigFields) -> DnsEngines:
    dd = DnsEngines(name="")
    port = sub.integer("bootstrap_port", 0, 1, 65535) if sub.has("bootstrap_port") else None
    out = DnsEngines(
        name=sub.text("name", dd.name),
        port=sub.integer("port", dd.port, 1, 65535),
        scheme=sub.choice("scheme", dd.scheme, SCHEMES),
        interval_seconds=sub.seconds("interval_seconds", dd.interval_seconds, 0.1),
        api_key_env=sub.text("api_key_env", dd.api_key_env),
        kind=sub.choice("kind", dd.kind, ENGINE_KINDS),
        role=sub.choice("role", dd.role, ROLES),  # type: ignore[arg-type]
        bootstrap_port=port,
    )
    sub.done()
    return out


def _dns(f: ConfigFields) -> tuple[DnsEngines, ...]:
    """``engines.dns``: one name, or a list of them (a name per pool); an empty name (the
    chart's default) means none."""
    if isinstance(f.data.get("dns"), list):
        found = [d for d in map(_dns_name, f.items("dns")) if d.name]
    else:
        sub = f.sub("dns")
        found = [d for d in (_dns_name(sub),) if d.name] if sub is not None else []
    seen: set[str] = set()
    for d in found:
        if d.name in seen:
            f.fail(f.at("dns"), f"the name {d.name} is listed twice")
        seen.add(d.name)
    if len({d.api_key_env for d in found}) > 1:
        f.fail(f.at("dns"), "every DNS name must use the same api_key_env")
    return tuple(found)


def engine_sources(f: ConfigFields | None) -> EngineSources:
    d = EngineSources()
    if f is None:
        return d
    static = _static(f)
    out = dataclasses.replace(
        static,
        dns=_dns(f),
        models_refresh_seconds=f.seconds("models_refresh_seconds", d.models_refresh_seconds, 0.1),
        kv_events=_kv_events(f.sub("kv_events")),
        api_key_env=f.text("api_key_env", d.api_key_env),
        section=f.path,
        pods=pod_engines(f.sub("pods")),
    )
    f.done()
    return out


def _metric_names(f: ConfigFields | None) -> MetricNames:
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


def engine_metrics(f: ConfigFields | None) -> EngineMetricsSettings:
    d = EngineMetricsSettings()
    if f is None:
        return d
    out = EngineMetricsSettings(
        enabled=f.flag("enabled", d.enabled),
        interval_seconds=f.seconds("interval_seconds", d.interval_seconds),
        timeout_seconds=f.seconds("timeout_seconds", d.timeout_seconds),
        stale_after_intervals=f.integer("stale_after_intervals", d.stale_after_intervals, 1, 1000),
        names=_metric_names(f.sub("names")),
        learn_capacity=f.flag("learn_capacity", d.learn_capacity),
    )
    f.done()
    return out
