"""The gateway's config file: its model, strict loading, and command-line overrides.

The file's shape is shared with the Helm chart, so its names are a contract::

    listen: {host: 0.0.0.0, port: 8000}
    policy: /etc/kvrouter/policy/policy.yaml     # a file, or a preset name
    policy_reload: {enabled: true, interval_seconds: 2}
    backends:
      static: [http://vllm-0.vllm:8000]
      dns: {name: vllm-headless.default.svc.cluster.local, port: 8000, scheme: http,
            interval_seconds: 10}
      models_refresh_seconds: 30
    health: {path: /health, interval_seconds: 5, timeout_seconds: 2, eject_after_failures: 3,
             readmit_backoff_seconds: 5, readmit_backoff_max_seconds: 60}
    timeouts: {connect_seconds: 5, first_byte_seconds: 300, idle_stream_seconds: 120}
    limits: {max_body_bytes: 16777216, max_attempts: 3}
    admin_token_env: KVROUTER_ADMIN_TOKEN
    gossip: {enabled: false, port: 7946, dns: "", peers: [], secret_env: KVROUTER_GOSSIP_SECRET,
             tls: {cert_file: "", key_file: "", ca_file: ""}}

Every section and field is optional; defaults are the values above, except that there are no
backends by default. Loading is strict like the policy loader (``router.core.fields``): unknown
keys and wrong types are errors that name the file and the field path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from router.core.fields import Fields, parse_yaml, show
from router.presets import DEFAULT as DEFAULT_POLICY

# A server in a pod must listen on every interface to be reachable through its Service.
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
SCHEMES = ("http", "https")
DAY = 86_400.0


class ConfigError(ValueError):
    """A config file or flag that cannot be used; the message says where and why."""


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
class DnsBackends:
    """Every address of ``name`` is a backend ``scheme://address:port``; re-resolved."""

    name: str
    port: int = 8000
    scheme: str = "http"
    interval_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class Backends:
    static: tuple[str, ...] = ()
    dns: DnsBackends | None = None
    models_refresh_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class Health:
    """Active probes, and passive ejection after consecutive failures, readmitted with backoff."""

    path: str = "/health"
    interval_seconds: float = 5.0
    timeout_seconds: float = 2.0
    eject_after_failures: int = 3
    readmit_backoff_seconds: float = 5.0
    readmit_backoff_max_seconds: float = 60.0


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


@dataclass(frozen=True, slots=True)
class GossipTls:
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""


@dataclass(frozen=True, slots=True)
class Gossip:
    """Peer-to-peer sharing of index deltas and loads (accepted now, wired later)."""

    enabled: bool = False
    port: int = 7946
    dns: str = ""
    peers: tuple[str, ...] = ()
    secret_env: str = "KVROUTER_GOSSIP_SECRET"
    tls: GossipTls = field(default_factory=GossipTls)


@dataclass(frozen=True, slots=True)
class Config:
    """Everything ``kvrouter serve`` is configured with."""

    listen: Listen = field(default_factory=Listen)
    policy: str = DEFAULT_POLICY
    policy_reload: PolicyReload = field(default_factory=PolicyReload)
    backends: Backends = field(default_factory=Backends)
    health: Health = field(default_factory=Health)
    timeouts: Timeouts = field(default_factory=Timeouts)
    limits: Limits = field(default_factory=Limits)
    admin_token_env: str = "KVROUTER_ADMIN_TOKEN"
    gossip: Gossip = field(default_factory=Gossip)


def backend_url(text: str) -> str:
    """A backend base URL, normalised (no trailing slash); raises ``ValueError`` saying why."""
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
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{u.scheme}://{netloc}{u.path.rstrip('/')}"


def dns_target(text: str) -> tuple[str, int]:
    """``NAME:PORT`` -> (name, port); raises ``ValueError`` saying why."""
    name, sep, port = text.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be NAME:PORT with a port from 1 to 65535, got {text!r}")
    return name.strip("[]"), int(port)


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


def _backends(f: _Fields | None) -> Backends:
    if f is None:
        return Backends()
    static: list[str] = []
    for i, text in enumerate(f.texts("static")):
        try:
            static.append(backend_url(text))
        except ValueError as e:
            f.fail(f"{f.at('static')}[{i}]", str(e))
    dns: DnsBackends | None = None
    d = f.sub("dns")
    if d is not None:
        name = d.text("name", "")
        dns = DnsBackends(
            name=name,
            port=d.integer("port", 8000, 1, 65535),
            scheme=d.choice("scheme", "http", SCHEMES),
            interval_seconds=_seconds(d, "interval_seconds", 10.0, 0.1),
        )
        d.done()
        if not name:
            dns = None  # an empty name (the chart's default) means no DNS discovery
    out = Backends(tuple(static), dns, _seconds(f, "models_refresh_seconds", 30.0, 0.1))
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
    out = Gossip(
        enabled=f.flag("enabled", False),
        port=f.integer("port", 7946, 1, 65535),
        dns=f.text("dns", ""),
        peers=tuple(f.texts("peers")),
        secret_env=f.text("secret_env", "KVROUTER_GOSSIP_SECRET"),
        tls=tls,
    )
    f.done()
    return out


def parse_config(data: Any, where: str = "<config>") -> Config:
    """Decode a config from parsed YAML; raise ``ConfigError`` naming ``where`` and the field."""
    if data is None:
        data = {}  # an empty file is a config of defaults
    f = _Fields(data, "", where)
    policy = f.text("policy", DEFAULT_POLICY) or DEFAULT_POLICY
    token_env = f.text("admin_token_env", "KVROUTER_ADMIN_TOKEN")
    cfg = Config(
        listen=_listen(f.sub("listen")),
        policy=policy,
        policy_reload=_policy_reload(f.sub("policy_reload")),
        backends=_backends(f.sub("backends")),
        health=_health(f.sub("health")),
        timeouts=_timeouts(f.sub("timeouts")),
        limits=_limits(f.sub("limits")),
        admin_token_env=token_env,
        gossip=_gossip(f.sub("gossip")),
    )
    f.done()
    return cfg


def load_config_text(text: str, where: str) -> Config:
    """Parse config YAML text; errors name ``where``."""
    return parse_config(parse_yaml(text, where, ConfigError), where)


def load_config(path: str | Path) -> Config:
    """Read and parse a config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None
    return load_config_text(text, str(p))


def with_overrides(
    cfg: Config,
    *,
    backends: list[str] | None = None,
    backend_dns: str | None = None,
    policy: str | None = None,
    host: str | None = None,
    port: int | None = None,
) -> Config:
    """``cfg`` with command-line flags applied (a flag replaces the file's value)."""
    b = cfg.backends
    if backends:
        urls: list[str] = []
        for text in backends:
            try:
                urls.append(backend_url(text))
            except ValueError as e:
                raise ConfigError(f"--backend: {e}") from None
        b = dataclasses.replace(b, static=tuple(urls))
    if backend_dns:
        try:
            name, dport = dns_target(backend_dns)
        except ValueError as e:
            raise ConfigError(f"--backend-dns: {e}") from None
        old = b.dns or DnsBackends(name)
        b = dataclasses.replace(b, dns=dataclasses.replace(old, name=name, port=dport))
    listen = cfg.listen
    if host is not None:
        listen = dataclasses.replace(listen, host=host)
    if port is not None:
        listen = dataclasses.replace(listen, port=port)
    return dataclasses.replace(cfg, backends=b, listen=listen, policy=policy or cfg.policy)


def check_ready_to_serve(cfg: Config) -> None:
    """Cross-checks that only matter once flags are applied; raises ``ConfigError``."""
    if not cfg.backends.static and cfg.backends.dns is None:
        raise ConfigError(
            "no backends: give --backend URL, --backend-dns NAME:PORT, "
            "or backends.static / backends.dns in the config file"
        )
    if not cfg.listen.host:
        raise ConfigError("listen.host: must not be empty")
