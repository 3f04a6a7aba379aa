"""``kvrouter engine-sim``: its options, and one engine served until SIGINT or SIGTERM.

Exit codes: 0 after a signal, 2 for settings that describe no engine (a cache smaller than one
block), 1 for an address that cannot be listened on.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Any

from router import hostport
from router.core.blocks import CHARS_PER_TOKEN
from router.core.disaggregation import DEFAULT_KV_BYTES_PER_TOKEN, ROLES, DisaggSettings
from router.core.engine_model import EngineSpec
from router.enginesim.app import serving
from router.enginesim.disagg_wire import DEFAULT_WAIT_SECONDS, LOAD_FAILURES, RoleSettings
from router.enginesim.engine import DEFAULT_MODEL, ENGINE_KINDS, SimSettings
from router.enginesim.kv_publisher import ENCODINGS, HASH_KINDS, EventSettings
from router.eventloop import loop_factory
from router.hostport import LOOPBACK
from router.local_tokenizer import LocalTokenizer


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    """Settings from parsed ``engine-sim`` arguments; raises ``ValueError`` on a bad spec."""
    spec = EngineSpec(
        capacity_tokens=args.kv_capacity_tokens,
        block_tokens=args.block_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s,
        max_batch=args.max_batch,
    )
    events = None
    if args.kv_events_port is not None:
        events = EventSettings(
            port=args.kv_events_port,
            replay_port=args.kv_events_replay_port,
            topic=args.kv_events_topic,
            encoding=args.kv_events_encoding,
            hashes=args.kv_events_hashes,
            host=args.host,
        )
    roles = RoleSettings(
        role=args.role,
        link=DisaggSettings(link_gbps=args.link_gbps, kv_bytes_per_token=args.kv_bytes_per_token),
        host=args.host,
        bootstrap_port=args.bootstrap_port,
        wait_seconds=args.transfer_timeout,
        load_failure=args.kv_load_failure,
    )
    return SimSettings(
        model=args.model,
        spec=spec,
        fast=args.fast,
        events=events,
        api_key=args.api_key,
        tokenizer=LocalTokenizer.load(args.tokenizer) if args.tokenizer else None,
        kind=args.kind,
        roles=roles,
    )


def _positive(kind: Callable[[str], int | float]) -> Callable[[str], Any]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``engine-sim`` options; defaults come from ``EngineSpec``."""
    d = EngineSpec()
    add = parser.add_argument
    add(
        "--port",
        type=int,
        required=True,
        metavar="P",
        help="TCP port to listen on (0: any free port)",
    )
    add("--host", default=LOOPBACK, metavar="H", help="address to listen on (default: %(default)s)")
    add(
        "--model",
        default=DEFAULT_MODEL,
        metavar="NAME",
        help="served model name (default: %(default)s)",
    )
    add(
        "--kv-capacity-tokens",
        type=_positive(int),
        default=d.capacity_tokens,
        metavar="N",
        help=f"prefix-cache capacity in tokens, each {CHARS_PER_TOKEN} characters of prompt as "
        "the router counts them (default: %(default)s)",
    )
    add(
        "--block-tokens",
        type=_positive(int),
        default=d.block_tokens,
        metavar="N",
        help="tokens per cache block (default: %(default)s)",
    )
    add(
        "--prefill-tokens-per-s",
        type=_positive(float),
        default=d.prefill_tokens_per_s,
        metavar="X",
        help="prefill speed (default: %(default)s)",
    )
    add(
        "--decode-tokens-per-s",
        type=_positive(float),
        default=d.decode_tokens_per_s,
        metavar="Y",
        help="decode speed per sequence (default: %(default)s)",
    )
    add(
        "--max-batch",
        type=_positive(int),
        default=d.max_batch,
        metavar="B",
        help="requests decoded at once (default: %(default)s)",
    )
    add("--fast", action="store_true", help="no delays; the cache and stats still work")
    add(
        "--kind",
        choices=ENGINE_KINDS,
        default="vllm",
        help="vllm: a closed connection stops its request; sglang: only POST /abort_request "
        "(or the request's end) does (default: %(default)s)",
    )
    add(
        "--api-key",
        default="",
        metavar="KEY",
        help="answer 401 to any request without 'Authorization: Bearer KEY', on every route "
        "(vLLM's --api-key guards /v1 only; guarding all shows a router sends it everywhere)",
    )
    add(
        "--tokenizer",
        metavar="PATH",
        help="count prompts in this tokenizer's ids (a tokenizer.json, or a model's folder with "
        "its chat template) rather than in 4-character pieces: in the cache, the KV events "
        "and POST /tokenize",
    )
    pd = parser.add_argument_group(
        "Prefill/decode disaggregation",
        "The engine's role, spoken in the protocol of --kind (vLLM's kv_transfer_params or "
        "SGLang's bootstrap rooms).",
    )
    pd.add_argument(
        "--role",
        choices=ROLES,
        default="both",
        help="prefill: prefills for decode engines; decode: decodes what prefill engines "
        "prefilled; both: an ordinary engine (default: %(default)s)",
    )
    pd.add_argument(
        "--link-gbps",
        type=_positive(float),
        default=DisaggSettings().link_gbps,
        metavar="G",
        help="the prefill-to-decode link in Gbit/s, for the simulated transfer "
        "(default: %(default)s)",
    )
    pd.add_argument(
        "--kv-bytes-per-token",
        type=_positive(int),
        default=DEFAULT_KV_BYTES_PER_TOKEN,
        metavar="B",
        help="what one token's KV cache weighs (default: %(default)s, an 8B Llama in FP16)",
    )
    pd.add_argument(
        "--bootstrap-port",
        type=int,
        default=0,
        metavar="P",
        help="an SGLang prefill engine's bootstrap server port (default: 0, a free port, "
        "reported in /stats as bootstrap_port)",
    )
    pd.add_argument(
        "--transfer-timeout",
        type=_positive(float),
        default=DEFAULT_WAIT_SECONDS,
        metavar="S",
        help="how long held KV waits to be pulled and one side of a request waits for the "
        "other (default: %(default)s)",
    )
    pd.add_argument(
        "--kv-load-failure",
        choices=LOAD_FAILURES,
        default="fail",
        help="a decode engine whose KV cannot be pulled: fail the request, or prefill it "
        "here (vLLM's kv_load_failure_policy; default: %(default)s)",
    )
    ev = parser.add_argument_group(
        "KV cache events", "Publish the prefix cache's stores and evictions as vLLM does (ZMQ)."
    )
    ev.add_argument(
        "--kv-events-port", type=int, metavar="P", help="publish events on this port (PUB)"
    )
    ev.add_argument(
        "--kv-events-replay-port",
        type=int,
        metavar="P",
        help="answer replay requests on this port (ROUTER)",
    )
    ev.add_argument(
        "--kv-events-topic", default="", metavar="T", help="topic frame (default: empty)"
    )
    ev.add_argument(
        "--kv-events-encoding",
        choices=ENCODINGS,
        default="map",
        help="events as tagged arrays (vLLM < 0.24) or maps (default: %(default)s)",
    )
    ev.add_argument(
        "--kv-events-hashes",
        choices=HASH_KINDS,
        default="int",
        help="block hashes as uint64 or 32 bytes (default: %(default)s)",
    )


async def _serve_until_signalled(settings: SimSettings, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(settings, host, port) as url:
        print(f"engine-sim: model {settings.model} on {url}", flush=True)
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    """Serve one simulated engine until SIGINT or SIGTERM."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"kvrouter engine-sim: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(_serve_until_signalled(settings, args.host, args.port))
    except OSError as exc:
        address = hostport.join(args.host, args.port)
        print(f"kvrouter engine-sim: cannot listen on {address}: {exc}", file=sys.stderr)
        return 1
    return 0
