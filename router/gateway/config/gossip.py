"""The ``gossip`` section of the config file: sharing the index and load with other replicas,
its strict parser, and the command-line flags that override it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router import hostport
from router.core.fields import ConfigFields
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
    d = GossipSettings()
    if f is None:
        return d
    tls = d.tls
    t = f.sub("tls")
    if t is not None:
        tls = GossipTls(
            t.text("cert_file", d.tls.cert_file),
            t.text("key_file", d.tls.key_file),
            t.text("ca_file", d.tls.ca_file),
        )
        t.done()
    peers: list[str] = []
    for i, text in enumerate(f.texts("peers")):
        try:
            peers.append(gossip_peer(text))
        except ValueError as e:
            f.fail(f"{f.at('peers')}[{i}]", str(e))
    dns = f.text("dns", d.dns)
    advertise = f.text("advertise", d.advertise)
    for key, value, check in (("dns", dns, gossip_dns), ("advertise", advertise, gossip_peer)):
        if value:
            try:
                check(value)
            except ValueError as e:
                f.fail(f.at(key), str(e))
    out = GossipSettings(
        enabled=f.flag("enabled", d.enabled),
        port=f.integer("port", d.port, 1, 65535),
        dns=dns.strip(),
        peers=tuple(peers),
        secret_env=f.text("secret_env", d.secret_env),
        tls=tls,
        advertise=advertise.strip(),
        node_id=f.text("node_id", d.node_id),
        preset=f.choice("preset", d.preset, GOSSIP_PRESETS),
    )
    f.done()
    return out
