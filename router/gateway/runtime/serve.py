"""The gateway's process runtime: serve one gateway in this process until a signal stops it.

``run_gateway`` is what ``kvrouter serve`` runs, and what each ``--workers`` process runs
(``router.gateway.runtime.workers``): an event loop (uvloop where installed), the aiohttp runner
with handler cancellation (a client that leaves cancels its engine request), SIGTERM/SIGINT for a
graceful stop (router.gateway.runtime.drain: ``/ready`` turns 503, no new connections, in-flight
requests get ``drain.grace_seconds`` and are then cut with a clean error), SIGHUP for
an immediate reload of the policy and of the config file's model aliases, and exit codes: 2
for a policy that does not load, 1 for a port or gossip listener that cannot be had. With
``epp.port`` the endpoint picker (router.gateway.extproc) serves on its own port from the same
gateway.

The listening socket serves aiohttp's server through the gateway's own connection protocol
(``router.gateway.inbound.connections``: the connection cap, the header deadline, errors in OpenAI's
shape), so it is opened with ``loop.create_server`` rather than aiohttp's ``TCPSite``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import TYPE_CHECKING

from aiohttp import web

from router.core.fields import ConfigError
from router.core.policy import PolicyError
from router.eventloop import loop_factory
from router.gateway.app import build_app, build_metrics_app
from router.gateway.config.settings import Config
from router.gateway.extproc.server import PickerServer
from router.gateway.inbound.connections import Connections, fit_open_files
from router.gateway.runtime import collector
from router.gateway.runtime.drain import CUT_SECONDS
from router.gateway.wiring import Gateway
from router.presets import resolve

if TYPE_CHECKING:
    from router.gossip import GossipConfig

log = logging.getLogger(__name__)

# Connections the kernel queues before the gateway accepts them (aiohttp's TCPSite default).
LISTEN_BACKLOG = 128


async def serve(
    cfg: Config, gossip: GossipConfig | None = None, *, reuse_port: bool = False
) -> None:
    """Run the gateway (a replica of a gossiping fleet with ``gossip``) until SIGTERM/SIGINT.

    ``reuse_port``: listen with SO_REUSEPORT, so that sibling worker processes share the port.
    """
    gw = Gateway(cfg, resolve(cfg.policy), gossip=gossip)
    fit_open_files(cfg.limits.max_connections)
    # A disconnecting client must cancel its handler, so the engine's request is cancelled too.
    # The drain owns the grace period; what the runner finds still running after it had
    # its cut and the moment to write its last bytes.
    runner = web.AppRunner(build_app(gw), handler_cancellation=True, shutdown_timeout=CUT_SECONDS)
    try:
        await runner.setup()
    except BaseException:
        await gw.upstream.close()  # nothing else started: the gossip listener comes first
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gw.reload)
    listener: asyncio.Server | None = None
    scrapes = web.AppRunner(build_metrics_app(gw), access_log=None)
    scrapes_listener: asyncio.Server | None = None
    picker = picker_server(gw, reuse_port=reuse_port)
    try:
        if picker is not None:
            await picker.start()
        assert runner.server is not None  # set up above
        listener = await loop.create_server(
            gw.connections.factory(runner.server, access_log=None),
            cfg.listen.host,
            cfg.listen.port,
            reuse_port=reuse_port or None,
            backlog=LISTEN_BACKLOG,
        )
        if cfg.listen.metrics_port:
            await scrapes.setup()
            assert scrapes.server is not None
            # Its own connection limits: a flood of scrapes takes no client's place.
            scrapes_listener = await loop.create_server(
                Connections(cfg.limits).factory(scrapes.server, access_log=None),
                cfg.listen.host,
                cfg.listen.metrics_port,
                reuse_port=reuse_port or None,
            )
        collector.settle()
        log.info(
            "listening on %s:%d%s; policy %s from %s; %d static engine(s)%s",
            cfg.listen.host,
            cfg.listen.port,
            f" (/metrics on {cfg.listen.metrics_port})" if cfg.listen.metrics_port else "",
            gw.core.policy.name,
            gw.watcher.path,
            len(cfg.engines.static),
            "".join(f", DNS {d.name}:{d.port} ({d.role})" for d in cfg.engines.dns),
        )
        await stop.wait()
        grace = cfg.drain.grace_seconds
        log.info("stopping: %d request(s) in flight get up to %gs", gw.drain.in_flight, grace)
        listener.close()  # no new connections; open ones are closed after their answer
        await gw.drain.run(grace, time.monotonic)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if listener is not None:
            listener.close()  # no new connections; the runner drains the open ones
        if picker is not None:
            await picker.stop()
        await runner.cleanup()
        # Last: the drain stays visible to scrapers.
        if scrapes_listener is not None:
            scrapes_listener.close()
        await scrapes.cleanup()


def picker_server(gw: Gateway, *, reuse_port: bool = False) -> PickerServer | None:
    """The endpoint picker for ``gw`` when ``epp.port`` is set (router.gateway.extproc)."""
    epp = gw.config.epp
    if not epp.enabled:
        return None
    return PickerServer(
        gw.services, gw.config.listen.host, epp.port, gw.ready, reuse_port=reuse_port
    )


def setup_logging(level: str, tag: str = "") -> None:
    """Log to stderr at ``level``; ``tag`` (e.g. ``[worker 1]``) follows the logger's name."""
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s",
        stream=sys.stderr,
    )


def run_gateway(cfg: Config, gossip: GossipConfig | None, *, reuse_port: bool = False) -> int:
    """Serve ``cfg`` in this process until stopped; the exit code (2 bad policy, 1 bad port)."""
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(cfg, gossip, reuse_port=reuse_port))
    except (PolicyError, ConfigError) as e:  # a policy, or keys the config names, unreadable
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if gossip is not None:
            from router.gateway.replicas.replica import GossipStartError  # loaded: gossip is on

            if isinstance(e, GossipStartError):
                print(f"kvrouter serve: {e}", file=sys.stderr)
                return 1
        print(
            f"kvrouter serve: cannot listen on {cfg.listen.host}:{cfg.listen.port}: {e}",
            file=sys.stderr,
        )
        return 1
    return 0
