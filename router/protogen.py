"""Generate the gossip protocol's Python code from proto/ (run by ``make install``).

The generated modules are build output: they live in router/gossip/pb/, are never edited by
hand, and are not committed, so they always match proto/ and the installed protobuf runtime.

protoc writes imports between generated modules as top-level imports (``import gossip_pb2``),
which only work with the output directory on sys.path. They are rewritten to relative imports
(``from . import gossip_pb2``) so that the modules work as the package ``router.gossip.pb``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent / "gossip" / "pb"


def relative_imports(source: str, modules: set[str]) -> str:
    """Rewrite ``import X`` of a sibling generated module ``X`` to ``from . import X``."""

    def fix(m: re.Match[str]) -> str:
        return f"from . import {m[1]}{m[2]}" if m[1] in modules else m[0]

    return re.sub(r"^import (\w+)( as \w+)?$", fix, source, flags=re.MULTILINE)


def main() -> int:
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        return 0
    from grpc_tools import protoc  # build-time tool, from the dev extras

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "__init__.py").write_text('"""Generated from proto/; do not edit."""\n')
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={OUT_DIR}",
        f"--pyi_out={OUT_DIR}",
        f"--grpc_python_out={OUT_DIR}",
        *(str(p) for p in protos),
    ]
    code: int = protoc.main(args)
    if code != 0:
        return code
    modules = {f"{p.stem}_pb2" for p in protos} | {f"{p.stem}_pb2_grpc" for p in protos}
    for path in [*OUT_DIR.glob("*_pb2*.py"), *OUT_DIR.glob("*_pb2*.pyi")]:
        text = path.read_text()
        fixed = relative_imports(text, modules)
        if fixed != text:
            path.write_text(fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
