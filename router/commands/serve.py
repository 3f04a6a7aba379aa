"""``kvrouter serve``: the gateway in front of OpenAI-compatible engines.

Configuration comes from an optional YAML file (``--config``, see
``router.gateway.config.settings``) and flags; a flag replaces the file's value. It listens on
0.0.0.0:8000 by default (what a server in a pod needs; pass ``--host 127.0.0.1`` to keep it on this
machine). SIGTERM and SIGINT stop it gracefully (``/ready`` turns 503, in-flight requests get
``drain.grace_seconds`` to finish); SIGHUP reloads the policy file at once.

Several replicas behind one Service route as one with gossip (``router.gateway.replicas.replica``):
``--gossip-port`` (or ``gossip.enabled`` in the file) turns it on; peers come from
``--gossip-peer`` seeds and a re-resolved ``--gossip-dns`` name; the shared secret comes from
the environment (KVROUTER_GOSSIP_SECRET), or mutual TLS from the file's ``gossip.tls``.

``--workers N`` (N > 1) runs N such gateways as processes sharing the listening port
(SO_REUSEPORT) and gossiping with each other on loopback (``router.gateway.runtime.workers``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from router.core.fields import ConfigError
from router.gateway.config.epp import with_epp
from router.gateway.config.gossip import GOSSIP_PRESETS
from router.gateway.config.overrides import with_kv_events, with_overrides
from router.gateway.config.pods import with_pods
from router.gateway.config.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    Config,
    check_ready_to_serve,
    load_config,
)
from router.gateway.replicas.node_config import gossip_config
from router.gateway.runtime.serve import run_gateway, setup_logging
from router.presets import DEFAULT, NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` options."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="YAML config file (flags override its values)")
    # --backend and --backend-dns are the released spellings, accepted as aliases.
    add(
        "--engine",
        "--backend",
        dest="engines",
        action="append",
        metavar="URL",
        help="an engine's base URL, e.g. http://10.0.0.5:8000 (repeat for more)",
    )
    add(
        "--prefill",
        action="append",
        nargs="+",
        metavar=("URL", "BOOTSTRAP_PORT"),
        help="a prefill engine's base URL (repeat for more), and for an SGLang prefill server "
        "its bootstrap port; with --decode, requests are split by what moving the KV costs "
        "(the config's disaggregation section)",
    )
    add(
        "--decode",
        action="append",
        metavar="URL",
        help="a decode engine's base URL (repeat for more)",
    )
    add(
        "--engine-dns",
        "--backend-dns",
        dest="engine_dns",
        metavar="NAME:PORT",
        help="a DNS name whose every address is an engine (re-resolved periodically)",
    )
    add(
        "--engine-pods",
        metavar="SELECTOR",
        help="every Ready pod this label selector (key=value,...) picks is an engine, watched "
        "through the Kubernetes API (needs kvrouter[kubernetes])",
    )
    add(
        "--engine-pods-port",
        type=int,
        metavar="PORT",
        help="the port engines listen on in those pods (default 8000)",
    )
    add(
        "--engine-api-key-env",
        metavar="NAME",
        help="environment variable holding the API key every engine is sent (engines started "
        "with --api-key); the config file can give one per engine",
    )
    add(
        "--policy",
        metavar="FILE|PRESET",
        help=f"routing policy file or preset ({', '.join(NAMES)}; default {DEFAULT})",
    )
    add("--host", help=f"address to listen on (default {DEFAULT_HOST}: every interface)")
    add("--port", type=int, help=f"TCP port to listen on (default {DEFAULT_PORT})")
    add(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics on this port only, not on the API port (default: the API port)",
    )
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
    k = parser.add_argument_group(
        "engines' KV cache events",
        "Learn what each engine's prefix cache holds from its own KV events (vLLM, SGLang: "
        "ZMQ), keyed over the engine's token ids (its POST /tokenize).",
    )
    k.add_argument(
        "--kv-events",
        action="append",
        metavar="ENGINE_URL=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]",
        help="an engine's event endpoint, and optionally its replay endpoint (repeat for more)",
    )
    k.add_argument(
        "--kv-events-port",
        type=int,
        metavar="P",
        help="every engine publishes events on this port of its host",
    )
    k.add_argument(
        "--kv-events-replay-port",
        type=int,
        metavar="P",
        help="every engine answers replays on this port of its host",
    )
    k.add_argument(
        "--tokenizer",
        metavar="engine|PATH",
        help="where precise keys get token ids: engine (its POST /tokenize; the default), or "
        "the model's tokenizer.json or folder, with its chat template (no round trip)",
    )
    e = parser.add_argument_group(
        "endpoint picker for an Envoy-based gateway",
        "Serve Envoy's ext_proc API (the Gateway API Inference Extension's endpoint picker) "
        "and gRPC health on a port of its own, deciding as the proxy does.",
    )
    e.add_argument("--epp-port", type=int, metavar="P", help="serve the picker on this port")
    e.add_argument(
        "--no-proxy",
        action="store_true",
        help="the HTTP port serves only health, readiness, metrics and admin (Envoy proxies)",
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
        engines=args.engines,
        prefill=args.prefill,
        decode=args.decode,
        engine_dns=args.engine_dns,
        engine_api_key_env=args.engine_api_key_env,
        policy=args.policy,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        gossip_port=args.gossip_port,
        gossip_peers=args.gossip_peer,
        gossip_dns=args.gossip_dns,
        gossip_advertise=args.gossip_advertise,
        gossip_node_id=args.gossip_node_id,
        gossip_preset=args.gossip_preset,
    )
    cfg = with_kv_events(
        cfg,
        endpoints=args.kv_events,
        port=args.kv_events_port,
        replay_port=args.kv_events_replay_port,
        tokenizer=args.tokenizer,
    )
    cfg = dataclasses.replace(cfg, epp=with_epp(cfg.epp, args.epp_port, args.no_proxy))
    pods = with_pods(cfg.engines.pods, args.engine_pods, args.engine_pods_port)
    cfg = dataclasses.replace(cfg, engines=dataclasses.replace(cfg.engines, pods=pods))
    check_ready_to_serve(cfg)
    return cfg


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; exit 2 on a bad config or policy, 1 when the port is unusable."""
    setup_logging(args.log_level)
    try:
        cfg = config_from_args(args)
        if args.workers != 1:
            # Imported only for --workers: it brings the gossip library (grpc) with it.
            from router.gateway.runtime.workers import supervise

            return supervise(cfg, args.workers, args.log_level)
        gossip = gossip_config(cfg, os.environ)
    except ConfigError as e:
        print(f"kvrouter serve: {e}", file=sys.stderr)
        return 2
    return run_gateway(cfg, gossip)
