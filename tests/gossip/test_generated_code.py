"""The committed protocol code in router/gossip/pb/ matches proto/gossip.proto.

The comparison is of descriptors, not of text: proto/ is compiled afresh and its
FileDescriptorProto must equal the one embedded in the committed module, so the test does not
depend on how one grpcio-tools version or another lays out the generated source.
"""

from __future__ import annotations

import ast
import difflib
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import descriptor_pb2, text_format
from grpc_tools import protoc

from router.gossip.pb import gossip_pb2
from tests.support import ROOT

PROTO_DIR = ROOT / "proto"
GENERATED = ROOT / "router" / "gossip" / "pb"
REGENERATE = "proto/ and router/gossip/pb/ differ: regenerate the code with `make proto`"


def default_json_name(name: str) -> str:
    """protoc's JSON name of a field: lowerCamelCase, each underscore dropped."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def clear_default_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    """protoc's descriptor set spells out every field's json_name, while generated code keeps
    only the ones the proto sets: drop the default ones on both sides."""
    for m in messages:
        for f in [*m.field, *m.extension]:
            if f.json_name == default_json_name(f.name):
                f.ClearField("json_name")
        clear_default_json_names(m.nested_type)


def compiled(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / "gossip.binpb"
    # -I proto/ as `make proto` does, so the file is named gossip.proto in both; no source info.
    args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", "gossip.proto"]
    assert protoc.main(args) == 0, f"protoc failed on {PROTO_DIR / 'gossip.proto'}"
    (fd,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    clear_default_json_names(fd.message_type)
    return fd


def committed() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto.FromString(gossip_pb2.DESCRIPTOR.serialized_pb)
    clear_default_json_names(fd.message_type)
    return fd


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    want, have = compiled(tmp_path), committed()
    if want != have:
        diff = difflib.unified_diff(
            text_format.MessageToString(have).splitlines(),
            text_format.MessageToString(want).splitlines(),
            "router/gossip/pb/gossip_pb2.py",
            "proto/gossip.proto",
            lineterm="",
        )
        raise AssertionError(REGENERATE + "\n" + "\n".join(list(diff)[:80]))


def test_generated_stub_declares_every_message_and_enum(tmp_path: Path) -> None:
    fd = compiled(tmp_path)
    stub = (GENERATED / "gossip_pb2.pyi").read_text()
    declared = set(re.findall(r"^class (\w+)\(", stub, flags=re.MULTILINE))
    names = {m.name for m in fd.message_type} | {e.name for e in fd.enum_type}
    assert names <= declared, f"{REGENERATE}; missing from the .pyi: {sorted(names - declared)}"


def gencode_version() -> tuple[int, ...]:
    """The protobuf version the committed module was generated for (its runtime check)."""
    tree = ast.parse((GENERATED / "gossip_pb2.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "ValidateProtobufRuntimeVersion"
        ):
            major, minor, patch = (ast.literal_eval(a) for a in node.args[1:4])
            return (major, minor, patch)
    raise AssertionError("gossip_pb2.py has no ValidateProtobufRuntimeVersion call")


def protobuf_floor() -> tuple[int, ...]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (floor,) = (m[1] for d in deps if (m := re.fullmatch(r"protobuf>=([\d.]+)", d.strip())))
    return tuple(int(p) for p in floor.split("."))


def test_protobuf_runtime_floor_admits_no_older_runtime_than_the_gencode() -> None:
    # The generated module refuses to import under a protobuf runtime older than the one it was
    # generated for, so pyproject.toml must never let pip install such a runtime.
    assert protobuf_floor() >= gencode_version(), (
        f"pyproject.toml allows protobuf {protobuf_floor()}, older than the gencode "
        f"{gencode_version()} of router/gossip/pb/gossip_pb2.py: raise the floor"
    )
