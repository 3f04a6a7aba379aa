"""Generate the gossip protocol's Python code from proto/ (run by ``make install``).

The generated modules are build output: they live in router/gossip/pb/, are never edited by
hand, and are not committed, so they always match proto/ and the installed protobuf runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent / "gossip" / "pb"


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
    return code


if __name__ == "__main__":
    sys.exit(main())
