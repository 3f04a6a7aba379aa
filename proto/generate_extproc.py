"""Generate the endpoint picker's Python code from Envoy's protos vendored in proto/vendor/.

Every module lands flat in router/gateway/extproc/pb/ (``envoy/config/core/v3/base.proto``
becomes ``envoy_config_core_v3_base_pb2.py``), with the imports between them rewritten to
match. Envoy's published Python package of the same protos (xds-protos) is not used: it also
installs an old copy of OpenTelemetry's protos over the one the trace exporter imports.
The descriptors keep their proto names (``envoy.service.ext_proc.v3``...): on the wire and in
gRPC's method paths nothing differs from Envoy's own code.

    python proto/generate_extproc.py        (``make proto`` runs it)
"""

from __future__ import annotations

import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "proto" / "vendor"
OUT = ROOT / "router" / "gateway" / "extproc" / "pb"
PACKAGE = "router.gateway.extproc.pb"
SERVICE = "envoy/service/ext_proc/v3/external_processor.proto"
# protoc writes `from envoy.config.core.v3 import base_pb2 as ...` for each dependency.
_IMPORT = re.compile(r"^from ((?:envoy|udpa|xds|validate)(?:\.\w+)*) import (\w+)", re.MULTILINE)


def flat_name(proto_module: str, name: str) -> str:
    """``envoy.config.core.v3``, ``base_pb2`` -> ``envoy_config_core_v3_base_pb2``."""
    return f"{proto_module.replace('.', '_')}_{name}"


def _rewrite(text: str) -> str:
    return _IMPORT.sub(lambda m: f"from {PACKAGE} import {flat_name(m[1], m[2])}", text)


def _protoc(*args: str) -> None:
    well_known = resources.files("grpc_tools") / "_proto"
    if protoc.main(["protoc", f"-I{VENDOR}", f"-I{well_known}", *args]) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")


def generate(out: Path = OUT) -> list[Path]:
    """Write the generated modules into ``out``; return them."""
    protos = sorted(str(p.relative_to(VENDOR)) for p in VENDOR.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as d:
        _protoc(f"--python_out={d}", f"--pyi_out={d}", *protos)
        _protoc(f"--grpc_python_out={d}", SERVICE)
        for old in out.glob("*_pb2*.py*"):
            old.unlink()
        written = []
        for f in sorted(Path(d).rglob("*.py*")):
            rel = f.relative_to(d)
            target = out / "_".join(rel.parts)
            target.write_text(_rewrite(f.read_text()))
            written.append(target)
    return written


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for path in generate():
        print(path.relative_to(ROOT), file=sys.stderr)
