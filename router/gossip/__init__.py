"""Gossip between router replicas: membership, failure detection, index and load sharing.

Cut like hashicorp/memberlist, one concern per module:

- ``config``: ``GossipConfig`` and the ``LAN`` / ``LOCAL`` tuning presets.
- ``clock``: injectable time (``SystemClock``; ``ManualClock`` for tests and benches;
  ``SkewedClock``, a wrong one, for tests of real processes).
- ``transport``: the ``Transport`` seam and the in-memory network; ``grpc_transport``: gRPC,
  with the mutual-TLS credentials.
- ``wire``: the generated messages, and conversions between them and this library's values.
- ``auth``: the shared-secret MAC and the replay window.
- ``skew``: peers' clocks against this node's: what is tolerated, what refused, what logged.
- ``envelope``: frames sealed into envelopes, each for one recipient, and opened; refusals
  counted by reason (no I/O).
- ``membership``: the SWIM member table (no I/O).
- ``broadcast``: the retransmit-limited rumour queue.
- ``store``: delta ids, retained delta bodies and load reports held by a node.
- ``state``: ``NodeState``, a node's replicated state and what it merges, spreads, asks for
  and answers (no I/O).
- ``snapshot``: bounded snapshot sessions for catch-up.
- ``discovery``: seeds and a re-resolved DNS name.
- ``anti_entropy``: the push-pull rounds that repair what rumours missed, and snapshot
  catch-up, both the asking and the answering side.
- ``node``: ``GossipNode``, the loops, the calls to peers and the request handlers, behind
  ``start``/``stop``.
- ``delegate``: the application's hooks (the router's are ``router.gateway.replicas.delegate``).
- ``stats``: counters and gauges, and their ``kvrouter_gossip_*`` series.

The wire protocol is proto/gossip.proto. Importing the package does not import grpc: only
``grpc_transport`` does, so code that merely names gossip types stays light.
"""

from router.core.fields import ConfigError
from router.gossip.clock import Clock, ManualClock, SystemClock
from router.gossip.config import (
    LAN,
    LOCAL,
    PRESETS,
    SECRET_ENV,
    GossipConfig,
    TlsFiles,
    Tuning,
    secret_from_env,
)
from router.gossip.delegate import Delegate
from router.gossip.membership import Member, State
from router.gossip.node import GossipNode
from router.gossip.stats import GossipStats, Sample, samples
from router.gossip.transport import Faults, InMemoryNetwork, Transport, TransportError

__all__ = [
    "LAN",
    "LOCAL",
    "PRESETS",
    "SECRET_ENV",
    "Clock",
    "ConfigError",
    "Delegate",
    "Faults",
    "GossipConfig",
    "GossipNode",
    "GossipStats",
    "InMemoryNetwork",
    "ManualClock",
    "Member",
    "Sample",
    "State",
    "SystemClock",
    "TlsFiles",
    "Transport",
    "TransportError",
    "Tuning",
    "samples",
    "secret_from_env",
]
