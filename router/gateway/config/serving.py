"""The config file's sections that say how a request is served: the timeouts and limits on
its way to an engine, client keys, the wait queue, which of its headers engines see, and how
long it may finish when the gateway stops; each with its strict reader.

``router.gateway.config.settings`` composes them into ``Config``; its docstring gives every
field with its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.core.fields import ConfigFields
from router.gateway.openai.request import LARGE_BODY_BYTES, MAX_LARGE_BODY_PARSES


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
    # An engine's 4xx body: its message alone, cut before any traceback or path
    # (router.gateway.upstream.engine_errors), or the body as the engine sent it (a fleet
    # whose clients may see the engines' insides).
    engine_error_bodies: Literal["reduced", "verbatim"] = "reduced"


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


def timeouts(f: ConfigFields | None) -> Timeouts:
    """The ``timeouts`` section, or its defaults when the file has none."""
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


def limits(f: ConfigFields | None) -> Limits:
    """The ``limits`` section, or its defaults when the file has none."""
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


def forwarding(f: ConfigFields | None) -> Forwarding:
    """The ``forwarding`` section, or its defaults when the file has none."""
    d = Forwarding()
    if f is None:
        return d
    bodies = f.choice("engine_error_bodies", d.engine_error_bodies, ("reduced", "verbatim"))
    out = Forwarding(
        f.flag("client_credentials", d.client_credentials),
        f.flag("trust_forwarding_headers", d.trust_forwarding_headers),
        "verbatim" if bodies == "verbatim" else "reduced",
    )
    f.done()
    return out


def drain(f: ConfigFields | None) -> DrainSettings:
    """The ``drain`` section, or its defaults when the file has none."""
    d = DrainSettings()
    if f is None:
        return d
    out = DrainSettings(f.seconds("grace_seconds", d.grace_seconds, 0.0))
    f.done()
    return out


def auth(f: ConfigFields | None) -> Auth:
    """The ``auth`` section, or its defaults when the file has none."""
    d = Auth()
    if f is None:
        return d
    out = Auth(f.text("api_keys_file", d.api_keys_file), f.text("api_keys_env", d.api_keys_env))
    f.done()
    return out


def flow_control(f: ConfigFields | None) -> FlowControl:
    """The ``flow_control`` section, or its defaults when the file has none."""
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
