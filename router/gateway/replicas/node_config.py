"""The gossip node's config (``router.gossip.GossipConfig``), built from the gateway's config and
the environment: every one the gateway runs is built here.

- ``gossip_config``: one replica's, from the ``gossip`` section with flags applied. The secret
  comes from the variable ``gossip.secret_env`` names, TLS files are checked readable, and what
  is not given is worked out: the address peers dial (the listen host, else $POD_IP, else an
  address this host's name resolves to) and the node id ($POD_NAME, else HOSTNAME:PORT).
- ``worker_configs``: each ``--workers`` process's (router.gateway.runtime.workers). Without
  gossip configured, the workers form a private fleet on loopback ports, with the ``local``
  preset and the configured secret or one made for this run; with it, worker i gossips on
  ``gossip.port`` + i and joins the configured fleet, seeding with its siblings too.

The constants of the gossip library (the default port, the secret's variable, the minimum
secret length, the wildcard hosts, the presets) are its own (``router.gossip.config``). Nothing
here imports grpc: a config is worked out, or refused, before any listener exists.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from router import hostport
from router.core.fields import ConfigError
from router.gateway.config.gossip import GossipTls
from router.gateway.config.settings import DEFAULT_HOST, Config
from router.gossip.config import (
    MIN_SECRET_BYTES,
    PRESETS,
    WILDCARD_HOSTS,
    GossipConfig,
    TlsFiles,
    secret_from_env,
    split_hostport,
)

# Set from the downward API by the Helm chart: the pod's name (this replica's node id) and
# its IP (the address peers dial when the server listens on every interface).
POD_NAME_ENV = "POD_NAME"
POD_IP_ENV = "POD_IP"


def gossip_config(
    cfg: Config,
    environ: Mapping[str, str],
    *,
    hostname: Callable[[], str] = socket.gethostname,
    host_addresses: Callable[[str], list[str]] | None = None,
) -> GossipConfig | None:
    """The gossip node's config, or None when gossip is off; raises ``ConfigError``."""
    g = cfg.gossip
    if not g.enabled:
        return None
    secret = secret_from_env(environ, g.secret_env)
    tls = _tls_files(g.tls)
    if secret is None and tls is None:
        raise ConfigError(
            f"gossip is on, but replicas cannot authenticate each other: set {g.secret_env} "
            f"to a shared secret (the same on every replica, at least {MIN_SECRET_BYTES} "
            "bytes), or configure gossip.tls (cert_file, key_file, ca_file) for mutual TLS"
        )
    host = cfg.listen.host
    advertise = g.advertise or _advertise(
        host, g.port, environ, hostname, host_addresses or _host_addresses
    )
    node_id = g.node_id or environ.get(POD_NAME_ENV) or f"{hostname()}:{g.port}"
    # GossipConfig checks itself and raises the same ConfigError.
    return GossipConfig(
        node_id=node_id,
        bind=hostport.join(host or DEFAULT_HOST, g.port),
        advertise=advertise,
        seeds=g.peers,
        dns_name=g.dns or None,
        secret=secret,
        tls=tls,
        tuning=PRESETS[g.preset],
    )


def worker_configs(cfg: Config, n: int, environ: Mapping[str, str]) -> list[GossipConfig]:
    """Each of ``n`` workers' gossip config: with gossip off, a private fleet on free loopback
    ports; with it on, ``n`` consecutive ports from the configured one, siblings as peers.

    Raises ``ConfigError``.
    """
    g = cfg.gossip
    out: list[GossipConfig] = []
    if not g.enabled:
        ports = hostport.free_ports(n)
        env = dict(environ)
        if not env.get(g.secret_env):
            env[g.secret_env] = secrets.token_urlsafe(32)
        for i, port in enumerate(ports):
            mine = dataclasses.replace(
                g,
                enabled=True,
                port=port,
                peers=tuple(hostport.join(hostport.LOOPBACK, p) for p in ports if p != port),
                dns="",
                tls=GossipTls(),
                advertise=hostport.join(hostport.LOOPBACK, port),
                node_id=_worker_node_id(cfg, environ, i),
                preset="local",
            )
            gc = gossip_config(dataclasses.replace(cfg, gossip=mine), env)
            assert gc is not None
            out.append(dataclasses.replace(gc, bind=hostport.join(hostport.LOOPBACK, port)))
        return out
    if g.port + n - 1 > 65535:
        raise ConfigError(f"--workers {n}: gossip ports {g.port} to {g.port + n - 1} exceed 65535")
    host = cfg.listen.host
    sibling_host = hostport.LOOPBACK if host in WILDCARD_HOSTS or host == "localhost" else host
    ports = [g.port + i for i in range(n)]
    for i, port in enumerate(ports):
        advertise = ""
        if g.advertise:
            ahost, aport = split_hostport(g.advertise, "advertise")
            advertise = hostport.join(ahost, aport + i)
        siblings = tuple(hostport.join(sibling_host, p) for p in ports if p != port)
        mine = dataclasses.replace(
            g,
            port=port,
            peers=g.peers + siblings,
            advertise=advertise,
            node_id=_worker_node_id(cfg, environ, i),
        )
        gc = gossip_config(dataclasses.replace(cfg, gossip=mine), environ)
        assert gc is not None
        out.append(gc)
    return out


def _worker_node_id(cfg: Config, environ: Mapping[str, str], index: int) -> str:
    """A configured node id (or pod name) made unique per worker; empty: the default."""
    base = cfg.gossip.node_id or environ.get(POD_NAME_ENV, "")
    return f"{base}-w{index}" if base else ""


def _tls_files(tls: GossipTls) -> TlsFiles | None:
    if not tls.configured:
        return None
    paths = {"cert_file": tls.cert_file, "key_file": tls.key_file, "ca_file": tls.ca_file}
    for key, path in paths.items():
        if not path:
            raise ConfigError(
                f"gossip.tls.{key}: mutual TLS needs cert_file, key_file and ca_file, "
                f"but {key} is empty"
            )
    for key, path in paths.items():
        try:
            Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"gossip.tls.{key}: cannot read {path}: {e.strerror or e}") from None
    return TlsFiles(Path(tls.cert_file), Path(tls.key_file), Path(tls.ca_file))


def _advertise(
    host: str,
    port: int,
    environ: Mapping[str, str],
    hostname: Callable[[], str],
    host_addresses: Callable[[str], list[str]],
) -> str:
    """Where peers reach this replica when ``advertise`` is not given."""
    if host == "localhost":
        return hostport.join(hostport.LOOPBACK, port)
    if host not in WILDCARD_HOSTS:
        return hostport.join(host, port)
    pod_ip = environ.get(POD_IP_ENV, "").strip()
    if pod_ip:
        return hostport.join(pod_ip, port)
    name = hostname()
    for address in host_addresses(name):
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            return hostport.join(address, port)
    raise ConfigError(
        f"gossip listens on every interface ({host or '0.0.0.0'}) and this host's name "
        f"{name!r} resolves to no address peers could dial: give --gossip-advertise HOST:PORT "
        f"(or gossip.advertise), or set {POD_IP_ENV}"
    )


def _host_addresses(name: str) -> list[str]:
    """The addresses ``name`` resolves to (none when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    # IPv4 first: the default listen address, 0.0.0.0, serves IPv4 only.
    found = {str(info[4][0]): info[0] for info in infos}
    return sorted(found, key=lambda a: found[a] != socket.AF_INET)
