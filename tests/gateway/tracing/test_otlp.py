"""The spans' wire encoding, read back by opentelemetry-proto's generated classes, field by field,
and the compiled encoder held to the reference's bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from router.core import hotpath
from router.gateway.tracing.otlp import Encoder, encoded, span
from router.gateway.tracing.spans import CLIENT, ERROR, INTERNAL, SERVER, Span, Value
from tests.core.test_hotpath import COMPILED, needs_compiled, reference
from tests.otlp import _value

ids64 = st.integers(min_value=1, max_value=(1 << 64) - 1)
texts = st.text(max_size=300)  # past 127 bytes: lengths of two varint bytes
values: st.SearchStrategy[Value] = st.one_of(
    texts,
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False),
    st.lists(st.text(max_size=20), max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=4),
)
times = st.integers(min_value=0, max_value=(1 << 64) - 1)


@st.composite
def some_span(draw: st.DrawFn) -> Span:
    s = Span(
        draw(texts),
        draw(st.sampled_from([INTERNAL, SERVER, CLIENT])),
        draw(st.integers(min_value=1, max_value=(1 << 128) - 1)),
        draw(st.just(0) | ids64),
        draw(times),
        draw(st.dictionaries(st.text(min_size=1, max_size=40), values, max_size=6)),
        draw(st.sampled_from(["", "vendor=opaque", "a=1,b@c=2"])),
    )
    s.end = draw(times)
    s.events = draw(st.lists(st.tuples(st.text(max_size=20), times), max_size=3))
    if draw(st.booleans()):
        s.fail(draw(st.text(max_size=20)))
    return s


def same(ours: Value, theirs: Any) -> bool:
    if isinstance(ours, (list, tuple)):
        return bool(list(ours) == theirs)
    return bool(ours == theirs) and type(ours) is type(theirs)


@given(st.lists(some_span(), min_size=1, max_size=5), st.text(max_size=30))
def test_otlp_every_field_reads_back_as_written(batch: list[Span], service: str) -> None:
    encoder = Encoder([("service.name", service), ("k8s.pod.name", "p-1")], "kvrouter", "9.9")
    request = ExportTraceServiceRequest.FromString(encoder.request(batch))
    (rs,) = request.resource_spans
    assert {a.key: _value(a.value) for a in rs.resource.attributes} == {
        "service.name": service,
        "k8s.pod.name": "p-1",
    }
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("kvrouter", "9.9")
    assert len(ss.spans) == len(batch)
    for ours, theirs in zip(batch, ss.spans, strict=True):
        assert theirs.name == ours.name and theirs.kind == ours.kind
        assert int.from_bytes(theirs.trace_id, "big") == ours.trace_id
        assert int.from_bytes(theirs.span_id, "big") == ours.span_id
        parent = ours.parent_id.to_bytes(8, "big") if ours.parent_id else b""
        assert theirs.parent_span_id == parent
        assert theirs.trace_state == ours.trace_state
        assert (theirs.start_time_unix_nano, theirs.end_time_unix_nano) == (ours.start, ours.end)
        got = {a.key: _value(a.value) for a in theirs.attributes}
        assert got.keys() == ours.attributes.keys()
        assert all(same(v, got[k]) for k, v in ours.attributes.items())
        assert [(e.name, e.time_unix_nano) for e in theirs.events] == ours.events
        assert (theirs.status.code, theirs.status.message) == (ours.status, ours.message)


def test_otlp_an_unset_status_and_no_parent_are_absent_fields() -> None:
    s = Span("x", SERVER, 1, 0, 5, {})
    s.end = 6
    request = ExportTraceServiceRequest.FromString(Encoder([], "kvrouter", "1").request([s]))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert not span.HasField("status") and span.parent_span_id == b""
    assert s.status != ERROR


@needs_compiled
@given(st.lists(some_span(), max_size=5))
def test_otlp_compiled_encoder_writes_the_references_bytes(batch: list[Span]) -> None:
    assert COMPILED is not None and hotpath.native is COMPILED
    ours = COMPILED.otlp_spans(batch)
    with reference():
        assert encoded(batch) == ours
    assert ours == b"".join(b"\x12" + _len(span(s)) + span(s) for s in batch)


def _len(body: bytes) -> bytes:
    n, out = len(body), bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes([*out, n])


@needs_compiled
def test_otlp_what_the_compiled_encoder_refuses_the_reference_writes() -> None:
    odd = Span("x", SERVER, 1, 0, 5, {"k": b"raw bytes"})  # not a type spans carry
    odd.end = 6
    assert COMPILED is not None
    with pytest.raises(TypeError):
        COMPILED.otlp_spans([odd])
    with reference():
        expected = encoded([odd])
    assert encoded([odd]) == expected
    too_big = Span("x", SERVER, 1 << 128, 0, 5, {})
    with pytest.raises(OverflowError):
        encoded([too_big])
