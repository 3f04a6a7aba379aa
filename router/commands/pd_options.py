"""``kvrouter simulate``'s disaggregation options (``--prefill-engines N --decode-engines M``).

With both pool sizes given, ``simulate`` replays the trace through four fleets of N + M engines
(``router.core.pd_simulator``): the aggregated kv-aware fleet, and N prefill + M decode engines
routed by kvrouter's decision, by always splitting, and by llm-d's fixed threshold, over a link
of ``--link-gbps``; engines stall decoding for the prefill beside them (``--decode-stall``).
The first ``--policy`` routes every fleet. Output: one row per fleet (``table``, aligned by
``simulate``), or ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

from router.core.disaggregation import DisaggSettings
from router.core.engine_model import EngineSpec
from router.core.pd_simulator import Objectives, PdFleet, PdResult

_LINK = DisaggSettings().link_gbps
_GOAL = Objectives()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "prefill/decode disaggregation",
        "both pool sizes replace --engines; --index, --bypass-share and --restart-at do not apply",
    )
    g.add_argument("--prefill-engines", type=int, metavar="N", help="prefill engines")
    g.add_argument("--decode-engines", type=int, metavar="M", help="decode engines")
    g.add_argument(
        "--link-gbps",
        type=float,
        default=_LINK,
        help=f"the prefill-to-decode link, in gigabits per second ({_LINK:g})",
    )
    g.add_argument(
        "--decode-stall",
        type=float,
        default=1.0,
        help="seconds a decoding sequence loses per second of prefill beside it (1)",
    )
    g.add_argument(
        "--ttft-objective",
        type=float,
        default=_GOAL.ttft_seconds,
        metavar="SECONDS",
        help=f"goodput counts a first token within this ({_GOAL.ttft_seconds:g})",
    )
    g.add_argument(
        "--tpot-objective",
        type=float,
        default=_GOAL.tpot_seconds,
        metavar="SECONDS",
        help=f"... and every later token within this ({_GOAL.tpot_seconds:g})",
    )
    g.add_argument(
        "--ttft-per-token",
        type=float,
        default=_GOAL.ttft_per_token,
        metavar="SECONDS",
        help="the TTFT objective grows by this per prompt token (0: one number for all)",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether the disaggregated comparison was asked for (either pool size given)."""
    return args.prefill_engines is not None or args.decode_engines is not None


def fleet_of(args: argparse.Namespace, spec: EngineSpec) -> tuple[PdFleet, Objectives]:
    """The fleet and objectives the flags describe; ``ValueError`` says which is wrong."""
    if args.prefill_engines is None or args.decode_engines is None:
        raise ValueError("--prefill-engines and --decode-engines go together")
    stalled = dataclasses.replace(spec, decode_stall=args.decode_stall)
    fleet = PdFleet(
        args.prefill_engines,
        args.decode_engines,
        stalled,
        DisaggSettings(link_gbps=args.link_gbps, prefill_tokens_per_s=spec.prefill_tokens_per_s),
        speedup=args.speedup,
        report_interval=args.report_interval,
    )
    goal = Objectives(args.ttft_objective, args.tpot_objective, args.ttft_per_token)
    return fleet, goal


def table(results: Sequence[PdResult]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The results as a table's head and rows, one row per fleet (paths: ``--json``)."""
    head: tuple[str, ...] = (
        "fleet", "goodput", "slo", "hit_ratio", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
        "split",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [
        (
            r.fleet,
            f"{r.goodput:.3f}/s",
            f"{r.slo_attainment:.3f}",
            f"{r.hit_ratio:.3f}",
            f"{r.ttft_p50:.3f}s",
            f"{r.ttft_p99:.3f}s",
            f"{r.tpot_p50 * 1000:.1f}ms",
            f"{r.tpot_p99 * 1000:.1f}ms",
            f"{r.split_share:.2f}",
        )
        for r in results
    ]
    return head, rows


def as_json(results: Sequence[PdResult]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)
