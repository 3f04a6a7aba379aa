"""This router's membership in a fleet of replicas: several ``kvrouter serve`` route as one.

Behind one Service each replica sees a share of the traffic. With gossip on, each one spreads
the blocks it records and its in-flight load per engine (``router.gossip``), so that every
replica decides on the merged index and on the whole fleet's load:

- the deltas this replica records (an exchange's ``Services.publish`` is ``Replica.queue``)
  are queued for the next gossip round;
- remote deltas go to ``BlockIndex.apply`` with the gateway's own clock (TTL ages);
- peers' load reports go to ``LoadBook.peer_report``, which the decision sums with the local
  counters; a peer declared dead (or silent past the load TTL) leaves through
  ``LoadBook.forget_peer``, while the blocks it recorded stay in the index: the engines still
  hold them.

Engines are named by their base URL as configured, normalised by
``router.gateway.config.engines.engine_url`` (the same code on every replica), so a delta names
the same engine everywhere.

``Replica`` owns the node (its config is built by ``router.gateway.replicas.node_config``), and
``Replica.running`` is the app's cleanup context that starts it and, on shutdown, announces
leaving and stops it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping

from router.core.decision import RoutingCore
from router.core.fields import ConfigError
from router.core.index import Delta
from router.gateway.replicas.delegate import IndexDelegate
from router.gossip import (
    PRESETS,
    Clock,
    GossipConfig,
    GossipNode,
    Sample,
    State,
    Transport,
    TransportError,
    samples,
)
from router.gossip.clock import system_clock
from router.gossip.discovery import Resolver
from router.gossip.grpc_transport import transport_for

log = logging.getLogger(__name__)

CONVERGENCE_LAG = "kvrouter_gossip_convergence_lag_seconds"


class GossipStartError(OSError):
    """The gossip listener could not start (its port is taken, or its TLS files are bad)."""


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
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        """``now`` is the clock the gateway routes with; the rest are seams for tests (the
        gossip clock defaults to ``system_clock`` of ``environ``)."""
        self.config = config
        clock = clock if clock is not None else system_clock(environ)
        self.bridge = IndexDelegate(lambda: core.index, core.loads, now=now, wall=clock.wall)
        self.node = GossipNode(
            config,
            self.bridge,
            transport if transport is not None else transport_for(config),
            clock=clock,
            resolver=resolver,
        )

    def queue(self, delta: Delta) -> None:
        """Spread a delta this replica recorded (an exchange's ``Services.publish``)."""
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
