"""The committed code in router/gateway/extproc/pb/ matches the protos vendored in proto/vendor/.

As for the gossip protocol (tests/gossip/test_generated_code.py), descriptors are compared,
not text: the vendored protos are compiled afresh, and each file's FileDescriptorProto must
equal the one embedded in its committed module.
"""

from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from router.gateway.extproc import pb
from tests.gossip.test_generated_code import clear_default_json_names, default_json_name
from tests.support import ROOT

VENDOR = ROOT / "proto" / "vendor"
REGENERATE = "proto/vendor/ and router/gateway/extproc/pb/ differ: run `make proto`"


def compiled(tmp_path: Path) -> list[descriptor_pb2.FileDescriptorProto]:
    out = tmp_path / "extproc.binpb"
    protos = sorted(str(p.relative_to(VENDOR)) for p in VENDOR.rglob("*.proto"))
    well_known = resources.files("grpc_tools") / "_proto"
    args = ["protoc", f"-I{VENDOR}", f"-I{well_known}", f"--descriptor_set_out={out}", *protos]
    assert protoc.main(args) == 0, "protoc failed on proto/vendor/"
    return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


def module_of(proto_name: str) -> str:
    """``envoy/type/v3/percent.proto`` -> its committed module's name."""
    return f"{pb.__name__}.{proto_name.removesuffix('.proto').replace('/', '_')}_pb2"


def test_every_vendored_proto_has_its_committed_module_and_they_agree(tmp_path: Path) -> None:
    files = compiled(tmp_path)
    assert len(files) == len(list(VENDOR.rglob("*.proto")))
    for want in files:
        have = descriptor_pb2.FileDescriptorProto.FromString(
            importlib.import_module(module_of(want.name)).DESCRIPTOR.serialized_pb
        )
        for fd in (want, have):
            clear_default_json_names(fd.message_type)
            # Top-level extensions too (the annotations are options' extensions).
            for f in fd.extension:
                if f.json_name == default_json_name(f.name):
                    f.ClearField("json_name")
        assert have == want, f"{REGENERATE}: {want.name}"


def test_the_service_stub_is_envoys_ext_proc_service() -> None:
    grpc = importlib.import_module(
        f"{pb.__name__}.envoy_service_ext_proc_v3_external_processor_pb2_grpc"
    )
    source = Path(str(grpc.__file__)).read_text()
    assert "/envoy.service.ext_proc.v3.ExternalProcessor/Process" in source
