"""``kvrouter policy check FILE ...``: validate policy files before they go live."""

from __future__ import annotations

import argparse
import sys

from router.core.policy import PolicyError
from router.presets import resolve
from router.yaml_files import load_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate policy files (exit 1 on the first bad one)")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy file or preset name")


def run(args: argparse.Namespace) -> int:
    bad = 0
    for spec in args.files:
        try:
            p = load_policy(resolve(spec))
        except PolicyError as e:
            print(f"error: {e}", file=sys.stderr)
            bad += 1
            continue
        scorers = ", ".join(f"{s.type} x{s.weight:g}" for s in p.scorers) or "none"
        print(f"ok: {spec}: {p.name} (picker {p.picker}, scorers {scorers})")
    return 1 if bad else 0
