"""This router's membership in a fleet of replicas: several ``kvrouter serve`` route as one.

Behind one Service each replica sees a share of the traffic. With gossip on, each one spreads
the blocks it records and its in-flight load per engine (``router.gossip``), so that every
replica decides on the merged index and on the whole fleet's load:

- local deltas (an exchange's ``Services.publish``) are queued for the next gossip round;
- remote deltas go to ``BlockIndex.apply`` with the gateway's own clock (TTL ages);
- peers' load reports go to ``LoadBook.report``, which the decision sums with the local
  counters; a peer declared dead (or silent past the load TTL) is ``LoadBook.forget``-ten,
  while the blocks it recorded stay in the index: the engines still hold them.

Engines are named by their base URL as configured, normalised by
``router.gateway.config.settings.engine_url`` (the same code on every replica), so a delta names the
same engine everywhere.

``gossip_config`` turns the config's ``gossip`` section (flags applied) and the environment
into a ``GossipConfig``; ``Replica`` owns the node, and ``Replica.running`` is the app's
cleanup context that starts it and, on shutdown, announces leaving and stops it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from router import hostport
from router.core.decision import RoutingCore
from router.core.fields import ConfigError
from router.core.index import Delta
from router.gateway.config.settings import Config, GossipTls
from router.gateway.replicas.delegate import IndexDelegate
from router.gossip import (
    PRESETS,
    Clock,
    GossipConfig,
    GossipNode,
    Sample,
    State,
    TlsFiles,
    Transport,
    TransportError,
    samples,
)
from router.gossip.discovery import Resolver
from router.gossip.grpc_transport import transport_for

log = logging.getLogger(__name__)

# Set from the downward API by the Helm chart: the pod's name (this replica's node id) and
# its IP (the address peers dial when the server listens on every interface).
POD_NAME_ENV = "POD_NAME"
POD_IP_ENV = "POD_IP"
# The library refuses shorter secrets; checked here too, to name the variable actually used.
MIN_SECRET_BYTES = 16
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
CONVERGENCE_LAG = "kvrouter_gossip_convergence_lag_seconds"


class GossipStartError(OSError):
    """The gossip listener could not start (its port is taken, or its TLS files are bad)."""


def gossip_config(
    cfg: Config,
    environ: Mapping[str, str],
    *,
    hostname: Callable[[], str] = socket.gethostname,
    host_addresses: Callable[[str], list[str]] | None = None,
) -> GossipConfig | None:
    """The gossip node's settings, or None when gossip is off; raises ``ConfigError``."""
    g = cfg.gossip
    if not g.enabled:
        return None
    text = environ.get(g.secret_env, "")
    secret = text.encode() if text else None
    tls = _tls_files(g.tls)
    if secret is None and tls is None:
        raise ConfigError(
            f"gossip is on, but replicas cannot authenticate each other: set {g.secret_env} "
            "to a shared secret (the same on every replica, at least 16 bytes), or configure "
            "gossip.tls (cert_file, key_file, ca_file) for mutual TLS"
        )
    if secret is not None and len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{g.secret_env}: the gossip secret must be at least {MIN_SECRET_BYTES} bytes, "
            f"got {len(secret)}"
        )
    host = cfg.listen.host
    advertise = g.advertise or _advertise(
        host, g.port, environ, hostname, host_addresses or _host_addresses
    )
    node_id = g.node_id or environ.get(POD_NAME_ENV) or f"{hostname()}:{g.port}"
    # GossipConfig checks itself and raises the same ConfigError.
    return GossipConfig(
        node_id=node_id,
        bind=hostport.join(host or "0.0.0.0", g.port),
        advertise=advertise,
        seeds=g.peers,
        dns_name=g.dns or None,
        secret=secret,
        tls=tls,
        tuning=PRESETS[g.preset],
    )


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
        return hostport.join("127.0.0.1", port)
    if host not in WILDCARDS:
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


class Replica:
    """This replica's gossip node, bridged to the routing core's index and load book."""

    def __init__(
        self,
        config: GossipConfig,
        core: RoutingCore,
        *,
        now: Callable[[], float] = time.monotonic,
        transport: Transport | None = None,
        clock: Clock | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        """``now`` is the clock the gateway routes with; the rest are seams for tests."""
        self.config = config
        self.bridge = IndexDelegate(lambda: core.index, core.loads, now=now)
        self.node = GossipNode(
            config,
            self.bridge,
            transport if transport is not None else transport_for(config),
            clock=clock,
            resolver=resolver,
        )

    def queue(self, delta: Delta) -> None:
        """Spread a delta the router recorded (``Services.publish`` is this method)."""
        self.bridge.queue(delta)

    def peers(self) -> Mapping[str, int]:
        """Peers by membership state (alive, suspect, dead), for kvrouter_gossip_peers."""
        return self.node.stats().peers

    def samples(self) -> list[Sample]:
        """The node's kvrouter_gossip_* series.

        Convergence lag is kept per delta origin only for members not known dead: every
        process run is a new origin, and a series per run would grow with every restart.
        """
        out = samples(self.node.stats())
        if not self.node.running:
            return [s for s in out if s.name != CONVERGENCE_LAG]
        live = {m.id for m in self.node.members() if m.state is not State.DEAD}
        return [
            s
            for s in out
            if s.name != CONVERGENCE_LAG or s.labels["origin"].rpartition("/")[0] in live
        ]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Listen and gossip while the app runs; on the way out, say goodbye and stop."""
        c = self.config
        try:
            await self.node.start()
        except (TransportError, ConfigError, OSError) as e:
            raise GossipStartError(f"gossip cannot start: {e}") from e
        auth = " + ".join(
            name for name, on in (("mutual TLS", c.tls), ("shared secret", c.secret)) if on
        )
        log.info(
            "gossip: node %s on %s (peers dial %s), %d seed(s)%s, %s, preset %s",
            c.node_id,
            c.bind,
            self.node.address,
            len(c.seeds),
            f", DNS {c.dns_name}" if c.dns_name else "",
            auth,
            next((k for k, v in PRESETS.items() if v == c.tuning), "custom"),
        )
        try:
            yield
        finally:
            await self.node.stop(leave=True)
