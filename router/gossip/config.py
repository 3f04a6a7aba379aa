"""Gossip settings: who this node is, how it finds peers, how it authenticates, how fast it talks.

``Tuning`` holds the timing and the bounds, with two named presets whose defaults carry their
reason: ``LAN`` for a fleet in one cluster, ``LOCAL`` for replicas on one host (loopback tests,
benches), named in ``PRESETS``. ``GossipConfig`` holds the rest and is checked once, when it is
built. The default port, the secret's variable and its minimum length and the wildcard hosts are
defined here, once, for the library and its users alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from router import hostport
from router.core.fields import ConfigError

SECRET_ENV = "KVROUTER_GOSSIP_SECRET"
# The HMAC-SHA256 key of every envelope: 16 bytes (128 bits) at least, since anyone who captures
# one MAC can try guesses at the secret offline, as fast as they can hash.
MIN_SECRET_BYTES = 16
DEFAULT_PORT = 7946
# Hosts that bind every interface: nobody dials them, so they are never an advertised address.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class Tuning:
    """Timing and bounds; every duration in seconds, every size in bytes."""

    gossip_interval: float
    fanout: int
    retransmit_mult: int
    probe_interval: float
    probe_timeout: float
    indirect_checks: int
    suspicion_mult: float
    dead_reclaim: float
    push_pull_interval: float
    rejoin_interval: float
    load_interval: float
    load_ttl: float
    call_timeout: float
    snapshot_timeout: float
    snapshot_cooldown: float
    want_timeout: float
    replay_window: float
    max_message_bytes: int
    rumours_bytes: int
    snapshot_chunk_bytes: int
    retained_bytes: int
    retained_per_origin: int
    queue_items: int
    local_queue: int
    max_members: int
    max_origins: int
    max_inflight: int
    max_serving: int
    snapshot_sessions: int
    snapshot_session_ttl: float
    replay_entries: int

    def retransmit_limit(self, nodes: int) -> int:
        """How many times each node sends one rumour: mult x ceil(log10(nodes + 1))."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(nodes + 1)))

    def suspicion_timeout(self, nodes: int) -> float:
        """How long a suspect has to refute before it is declared dead."""
        return self.suspicion_mult * max(1.0, math.log10(max(nodes, 1))) * self.probe_interval


LAN = Tuning(
    # A routed request's blocks are worth most in the first second (the same user's next turn,
    # a burst on one system prompt); 100 ms rounds with fanout 3 spread a delta to 16 replicas
    # in about 3-4 rounds, well under the 1 s goal.
    gossip_interval=0.1,
    fanout=3,
    # Sends per rumour per node = 6 x ceil(log10(N+1)): 6 below 10 replicas, 12 for 10-99.
    # Every node passes news on, so a node misses every offer of a delta with probability
    # about e^-limit and waits for push-pull; at memberlist's 4, about 1% of deltas in a fleet
    # of 8 did (bench/gossip_convergence.py). Offers are ids of a few bytes: 6 costs little.
    retransmit_mult=6,
    # SWIM timing as memberlist's LAN config: one probe a second per node, half a second for
    # an ack on a LAN, then indirect probes through 3 peers.
    probe_interval=1.0,
    probe_timeout=0.5,
    indirect_checks=3,
    # Suspicion lasts 4 x log10(N) probe intervals (at least 4 s): long enough for the suspect
    # to hear and refute, short enough that a dead replica's load leaves the books in seconds.
    suspicion_mult=4.0,
    # Dead members are remembered this long so that the news reaches everyone and a restarted
    # node can refute it; then they are forgotten.
    dead_reclaim=30.0,
    # Anti-entropy with one random peer every 2 s: digests are small (one line per origin), and
    # it bounds how long a lost delta stays lost.
    push_pull_interval=2.0,
    # Re-resolve the DNS name and re-contact seeds this often; 10 s matches how fast a
    # Kubernetes headless Service publishes a new pod.
    rejoin_interval=10.0,
    # Load moves with every request; two reports a second keep the fleet's bounded-load cap
    # honest without load dominating the bandwidth.
    load_interval=0.5,
    # A report not refreshed for 5 s is dropped: a replica that stopped reporting must not pin
    # load on an engine until it is declared dead.
    load_ttl=5.0,
    call_timeout=0.5,
    snapshot_timeout=5.0,
    # A snapshot can be megabytes; ask for one at most every 30 s per node.
    snapshot_cooldown=30.0,
    # An asked-for delta body that has not come within this is asked for again from others.
    want_timeout=1.0,
    # Frames older (or newer) than 30 s are refused as possible replays; replicas run NTP.
    replay_window=30.0,
    # gRPC's own default receive limit.
    max_message_bytes=4 * 1024 * 1024,
    # One gossip round's message to one peer (offers are ~3 bytes, so thousands fit).
    rumours_bytes=64 * 1024,
    snapshot_chunk_bytes=1024 * 1024,
    # Recent deltas kept to repair peers; 16 MiB is ~15 s of a busy fleet's deltas. A peer
    # further behind gets a snapshot.
    retained_bytes=16 * 1024 * 1024,
    retained_per_origin=8192,
    # Pending rumours and offers per queue; beyond it the most-sent are dropped first.
    queue_items=65_536,
    # Local deltas waiting for the next round (at most one round's worth in steady state).
    local_queue=16_384,
    max_members=1024,
    # Each process run of a replica is a new delta origin; the least recently heard are
    # forgotten past this (their deltas, if they come again, merge harmlessly).
    max_origins=4096,
    # Outgoing exchanges in flight; a slow peer holds at most one of them.
    max_inflight=32,
    # Incoming exchanges served at once; more get RESOURCE_EXHAUSTED.
    max_serving=64,
    snapshot_sessions=2,
    snapshot_session_ttl=60.0,
    replay_entries=262_144,
)

LOCAL = replace(
    LAN,
    # Loopback round trips take microseconds, so everything runs ten times faster, which lets
    # tests and benches see failures detected and repaired in well under a second.
    gossip_interval=0.02,
    probe_interval=0.1,
    probe_timeout=0.05,
    suspicion_mult=3.0,
    dead_reclaim=3.0,
    push_pull_interval=0.3,
    rejoin_interval=0.5,
    load_interval=0.05,
    load_ttl=1.0,
    call_timeout=0.25,
    snapshot_timeout=2.0,
    snapshot_cooldown=0.5,
    want_timeout=0.2,
    snapshot_session_ttl=5.0,
)

PRESETS: dict[str, Tuning] = {"lan": LAN, "local": LOCAL}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for mutual TLS: this node's certificate and key, and the fleet's CA."""

    cert: Path
    key: Path
    ca: Path
    # Every replica's certificate carries this name, so peers dialled by IP can be verified.
    server_name: str = "kvrouter-gossip"

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA certificates) as bytes."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


@dataclass(frozen=True, slots=True)
class GossipConfig:
    """One node's identity, discovery, security and tuning."""

    node_id: str
    # Where the gossip listener binds, and the HOST:PORT peers use to reach it.
    bind: str = f"0.0.0.0:{DEFAULT_PORT}"
    advertise: str | None = None
    seeds: tuple[str, ...] = ()
    # A DNS name (NAME or NAME:PORT) whose addresses are all replicas, re-resolved periodically.
    dns_name: str | None = None
    secret: bytes | None = field(default=None, repr=False)
    tls: TlsFiles | None = None
    tuning: Tuning = LAN

    def __post_init__(self) -> None:
        if not self.node_id or len(self.node_id) > 128:
            raise ConfigError(f"gossip node_id must be 1-128 characters, got {self.node_id!r}")
        split_hostport(self.bind, "bind")
        if self.advertise is not None:
            split_hostport(self.advertise, "advertise")
        for i, seed in enumerate(self.seeds):
            split_hostport(seed, f"seeds[{i}]")
        if self.secret is None and self.tls is None:
            raise ConfigError(
                f"gossip needs peers to authenticate: set {SECRET_ENV} or configure TLS files"
            )
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"the gossip secret must be at least {MIN_SECRET_BYTES} bytes, "
                f"got {len(self.secret)}"
            )
        t = self.tuning
        if t.probe_timeout >= t.probe_interval:
            raise ConfigError(
                f"tuning.probe_timeout ({t.probe_timeout}) must be below "
                f"tuning.probe_interval ({t.probe_interval})"
            )
        if t.fanout < 1 or t.retransmit_mult < 1 or t.indirect_checks < 0:
            raise ConfigError("tuning.fanout and tuning.retransmit_mult must be at least 1")
        if t.rumours_bytes > t.max_message_bytes or t.snapshot_chunk_bytes > t.max_message_bytes:
            raise ConfigError("tuning.rumours_bytes and snapshot_chunk_bytes must fit a message")

    @property
    def advertised(self) -> str:
        """The address peers dial: ``advertise``, else ``bind`` when it names a host."""
        if self.advertise is not None:
            return self.advertise
        host, port = split_hostport(self.bind, "bind")
        if host in WILDCARD_HOSTS:
            raise ConfigError(f"gossip bind {self.bind!r} is a wildcard: set advertise")
        return hostport.join(host, port)

    @property
    def dns_target(self) -> tuple[str, int] | None:
        """(name, port) to resolve, the port defaulting to this node's own gossip port."""
        if self.dns_name is None:
            return None
        if ":" in self.dns_name:
            return split_hostport(self.dns_name, "dns_name")
        return self.dns_name, split_hostport(self.bind, "bind")[1]


def secret_from_env(env: Mapping[str, str] | None = None, name: str = SECRET_ENV) -> bytes | None:
    """The shared secret from the variable ``name`` (None when unset or empty); a secret that
    is too short raises ``ConfigError`` naming the variable."""
    value = (os.environ if env is None else env).get(name, "")
    if not value:
        return None
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{name}: the gossip secret must be at least {MIN_SECRET_BYTES} bytes, "
            f"got {len(secret)}"
        )
    return secret


def split_hostport(value: str, where: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ConfigError naming ``where``."""
    try:
        return hostport.split(value, port_zero=True)
    except ValueError as e:
        raise ConfigError(f"gossip {where}: {e}") from None
