"""The ``gossip`` section of the config file: sharing the index and load with other replicas,
its strict parser, and the command-line flags that override it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from router import hostport
from router.core.fields import ConfigError, ConfigFields
from router.gossip.config import DEFAULT_PORT, PRESETS, SECRET_ENV


@dataclass(frozen=True, slots=True)
class GossipTls:
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    @property
    def configured(self) -> bool:
        """Any of the files is set (then all three must be)."""
        return bool(self.cert_file or self.key_file or self.ca_file)


# Gossip timing presets: lan for a cluster, local for one host.
GOSSIP_PRESETS = tuple(PRESETS)


@dataclass(frozen=True, slots=True)
class GossipSettings:
    """Sharing of index deltas and in-flight load with the other router replicas."""

    enabled: bool = False
    port: int = DEFAULT_PORT
    dns: str = ""
    peers: tuple[str, ...] = ()
    secret_env: str = SECRET_ENV
    tls: GossipTls = field(default_factory=GossipTls)
    # HOST:PORT that peers dial; empty: worked out from the listen address or the pod's IP.
    advertise: str = ""
    # This replica's name among its peers; empty: the pod name, or hostname:port.
    node_id: str = ""
    preset: str = "lan"


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


def gossip(f: ConfigFields | None) -> GossipSettings:
    if f is None:
        return GossipSettings()
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
    out = GossipSettings(
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


def gossip_overrides(
    g: GossipSettings,
    *,
    port: int | None,
    peers: list[str] | None,
    dns: str | None,
    advertise: str | None,
    node_id: str | None,
    preset: str | None,
) -> GossipSettings:
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
