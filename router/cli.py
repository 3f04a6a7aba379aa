"""The ``kvrouter`` command: one console script, one subcommand per job.

Each subcommand's module is imported only when it runs, so ``kvrouter policy check`` does not
pay for aiohttp or grpc.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module with ``add_arguments(parser)`` and ``run(args) -> int``
_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("router.commands.serve", "run the gateway in front of OpenAI-compatible engines"),
    "engine-sim": ("router.enginesim.cli", "run a simulated OpenAI-compatible engine"),
    "simulate": ("router.commands.simulate", "replay a trace through the routing core offline"),
    "policy": ("router.commands.policy", "validate policy files"),
    "demo": (
        "router.commands.demo",
        "start engines and a router, compare policies live",
    ),
    "top": ("router.commands.top", "watch the fleet as its routers see it, live"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module (or every one, when None) is imported."""
    parser = argparse.ArgumentParser(
        prog="kvrouter", description="KV-cache-aware request router for LLM inference fleets."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or command == name:
            importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(command).parse_args(argv)
    code: int = importlib.import_module(args._module).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
