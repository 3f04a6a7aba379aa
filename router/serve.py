"""``kvrouter serve``: the gateway in front of OpenAI-compatible engines.

Configuration comes from an optional YAML file (``--config``, see ``router.config``) and flags;
a flag replaces the file's value. It listens on 0.0.0.0:8000 by default (what a server in a
pod needs; pass ``--host 127.0.0.1`` to keep it on this machine). SIGTERM and SIGINT stop it
gracefully (``/ready`` turns 503, in-flight requests get ``SHUTDOWN_GRACE_S`` to finish);
SIGHUP reloads the policy file at once.

Several replicas behind one Service route as one with gossip (``router.replicas``):
``--gossip-port`` (or ``gossip.enabled`` in the file) turns it on; peers come from
``--gossip-peer`` seeds and a re-resolved ``--gossip-dns`` name; the shared secret comes from
the environment (KVROUTER_GOSSIP_SECRET), or mutual TLS from the file's ``gossip.tls``.

``--workers N`` (N > 1) runs N such gateways as processes sharing the listening port
(SO_REUSEPORT) and gossiping with each other on loopback (``router.workers``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from aiohttp import web

from router.app import Gateway, build_app
from router.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    GOSSIP_PRESETS,
    Config,
    ConfigError,
    check_ready_to_serve,
    load_config,
    with_overrides,
)
from router.core.policy import PolicyError
from router.eventloop import loop_factory
from router.presets import DEFAULT, NAMES, resolve

if TYPE_CHECKING:
    from router.gossip import GossipConfig

log = logging.getLogger("router.serve")

SHUTDOWN_GRACE_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` options."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="YAML config file (flags override its values)")
    add(
        "--backend",
        action="append",
        metavar="URL",
        help="an engine's base URL, e.g. http://10.0.0.5:8000 (repeat for more)",
    )
    add(
        "--backend-dns",
        metavar="NAME:PORT",
        help="a DNS name whose every address is an engine (re-resolved periodically)",
    )
    add(
        "--policy",
        metavar="FILE|PRESET",
        help=f"routing policy file or preset ({', '.join(NAMES)}; default {DEFAULT})",
    )
    add("--host", help=f"address to listen on (default {DEFAULT_HOST}: every interface)")
    add("--port", type=int, help=f"TCP port to listen on (default {DEFAULT_PORT})")
    add(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes sharing the port, gossiping with each other as replicas of one "
        "fleet (default: %(default)s, a single process)",
    )
    g = parser.add_argument_group(
        "gossip between router replicas",
        "Share recorded prefixes and in-flight load with the other replicas, so that they "
        "route as one. The shared secret is read from KVROUTER_GOSSIP_SECRET (or the config's "
        "gossip.secret_env); mutual TLS is configured in the config file (gossip.tls).",
    )
    g.add_argument(
        "--gossip-port",
        type=int,
        metavar="P",
        help="gossip on this TCP port (turns gossip on; the file's gossip.port otherwise)",
    )
    g.add_argument(
        "--gossip-peer",
        action="append",
        metavar="HOST:PORT",
        help="a replica to join through (repeat for more)",
    )
    g.add_argument(
        "--gossip-dns",
        metavar="NAME:PORT",
        help="a DNS name whose every address is a replica, re-resolved periodically "
        "(a Kubernetes headless Service)",
    )
    g.add_argument(
        "--gossip-advertise",
        metavar="HOST:PORT",
        help="the address peers reach this replica at (default: the --host address; "
        "with 0.0.0.0, $POD_IP or the address this host's name resolves to)",
    )
    g.add_argument(
        "--gossip-node-id",
        metavar="ID",
        help="this replica's name among its peers (default: $POD_NAME, else HOSTNAME:PORT)",
    )
    g.add_argument(
        "--gossip-preset",
        choices=GOSSIP_PRESETS,
        help="gossip timing: lan (a cluster; the default) or local (replicas on one host)",
    )
    add(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log verbosity (default: %(default)s)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """The config file (if any) with the flags applied; raises ``ConfigError``."""
    cfg = load_config(args.config) if args.config else Config()
    cfg = with_overrides(
        cfg,
        backends=args.backend,
        backend_dns=args.backend_dns,
        policy=args.policy,
        host=args.host,
        port=args.port,
        gossip_port=args.gossip_port,
        gossip_peers=args.gossip_peer,
        gossip_dns=args.gossip_dns,
        gossip_advertise=args.gossip_advertise,
        gossip_node_id=args.gossip_node_id,
        gossip_preset=args.gossip_preset,
    )
    check_ready_to_serve(cfg)
    return cfg


def gossip_from(cfg: Config) -> GossipConfig | None:
    """The gossip node's settings from ``cfg`` and the environment; raises ``ConfigError``."""
    if not cfg.gossip.enabled:
        return None
    from router.replicas import gossip_config  # grpc is loaded only when gossip is on

    return gossip_config(cfg, os.environ)


async def serve(
    cfg: Config, gossip: GossipConfig | None = None, *, reuse_port: bool = False
) -> None:
    """Run the gateway (a replica of a gossiping fleet with ``gossip``) until SIGTERM/SIGINT.

    ``reuse_port``: listen with SO_REUSEPORT, so that sibling worker processes share the port.
    """
    gw = Gateway(cfg, resolve(cfg.policy), gossip=gossip)
    # A disconnecting client must cancel its handler, so the engine's request is cancelled too.
    runner = web.AppRunner(
        build_app(gw),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    try:
        await runner.setup()
    except BaseException:
        await gw.upstream.close()  # nothing else started: the gossip listener comes first
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gw.watcher.request)
    try:
        site = web.TCPSite(runner, cfg.listen.host, cfg.listen.port, reuse_port=reuse_port or None)
        await site.start()
        log.info(
            "listening on %s:%d; policy %s from %s; %d static backend(s)%s",
            cfg.listen.host,
            cfg.listen.port,
            gw.router.policy.name,
            gw.watcher.path,
            len(cfg.backends.static),
            f", DNS {cfg.backends.dns.name}:{cfg.backends.dns.port}" if cfg.backends.dns else "",
        )
        await stop.wait()
        log.info("stopping: draining in-flight requests for up to %gs", SHUTDOWN_GRACE_S)
        gw.draining = True
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()


def setup_logging(level: str, tag: str = "") -> None:
    """Log to stderr at ``level``; ``tag`` (e.g. ``[worker 1]``) follows the logger's name."""
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s",
        stream=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; exit 2 on a bad config or policy, 1 when the port is unusable."""
    setup_logging(args.log_level)
    try:
        cfg = config_from_args(args)
        if args.workers != 1:
            from router.workers import supervise

            return supervise(cfg, args.workers, args.log_level)
        gossip = gossip_from(cfg)
    except ConfigError as e:
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    return run_gateway(cfg, gossip)


def run_gateway(cfg: Config, gossip: GossipConfig | None, *, reuse_port: bool = False) -> int:
    """Serve ``cfg`` in this process until stopped; the exit code (2 bad policy, 1 bad port)."""
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(cfg, gossip, reuse_port=reuse_port))
    except PolicyError as e:
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if gossip is not None:
            from router.replicas import GossipStartError

            if isinstance(e, GossipStartError):
                print(f"kvrouter serve: {e}", file=sys.stderr)
                return 1
        print(
            f"kvrouter serve: cannot listen on {cfg.listen.host}:{cfg.listen.port}: {e}",
            file=sys.stderr,
        )
        return 1
    return 0
