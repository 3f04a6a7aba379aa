"""Spans onto OTLP's wire: an ``ExportTraceServiceRequest``, written as protobuf bytes directly.

No I/O. The message is small and fixed (opentelemetry/proto/trace/v1/trace.proto, the fields
below by number), so it is written from tags, lengths and values without building message
objects. ``span`` is the reference, about 4 us a span where the SDK's encoder takes 50; the
compiled twin (router/core/hotpath-c/otlp.c, through router.core.hotpath) writes the same
bytes in a tenth of that. tests/gateway/tracing decodes every field back with
opentelemetry-proto's own generated classes, and holds the two encoders to the same bytes.

    ExportTraceServiceRequest  1 resource_spans
    ResourceSpans              1 resource (1 attributes), 2 scope_spans
    ScopeSpans                 1 scope (1 name, 2 version), 2 spans
    Span                       1 trace_id, 2 span_id, 3 trace_state, 4 parent_span_id, 5 name,
                               6 kind, 7 start (fixed64), 8 end (fixed64), 9 attributes,
                               11 events (1 time, 2 name), 15 status (2 message, 3 code)
    KeyValue                   1 key, 2 value: AnyValue 1 string, 2 bool, 3 int, 4 double,
                               5 array (1 values)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from router.core import hotpath
from router.gateway.tracing.spans import Span, Value

_MASK64 = (1 << 64) - 1
_BYTE = [bytes((n,)) for n in range(0x80)]
_TIMES = struct.Struct("<BQBQ")  # start and end, each a tag and a fixed64
_EVENT_TIME = struct.Struct("<BQ")
_DOUBLE = struct.Struct("<Bd")
_KIND = [b"\x30" + _BYTE[k] for k in range(4)]
# A span's names and attribute keys are the code's constants: each is encoded once.
_KEYS: dict[str, bytes] = {}
_NAMES: dict[tuple[str, int], bytes] = {}
_MAX_KEYS = 256
_ATTRIBUTES: dict[tuple[str, type, Value], bytes] = {}
_MAX_ATTRIBUTES = 4096


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: its tag, the body's length, the body."""
    return tag + _varint(len(body)) + body


def _text(tag: bytes, s: str) -> bytes:
    return _field(tag, s.encode())


def _any(v: Value) -> bytes:
    """An AnyValue's body."""
    if isinstance(v, str):
        return _text(b"\x0a", v)
    if isinstance(v, bool):  # before int: a bool is an int to Python
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        return b"\x18" + _varint(v & _MASK64)  # int64: a negative is its two's complement
    if isinstance(v, float):
        return _DOUBLE.pack(0x21, v)
    return _field(b"\x2a", b"".join(_field(b"\x0a", _any(x)) for x in v))


def _key(k: str) -> bytes:
    out = _KEYS.get(k)
    if out is None:
        out = _text(b"\x0a", k)
        if len(_KEYS) < _MAX_KEYS:
            _KEYS[k] = out
    return out


def key_value(k: str, v: Value) -> bytes:
    """A KeyValue's body."""
    return _key(k) + _field(b"\x12", _any(v))


def _attribute(k: str, v: Value) -> bytes:
    """A span's attribute field, whole; the ones that recur (a route, an engine, a status) are
    written once: the type is part of the key, or ``True`` would find the field of ``1``."""
    if isinstance(v, (list, tuple)):
        return _field(b"\x4a", key_value(k, v))
    memo = (k, type(v), v)
    out = _ATTRIBUTES.get(memo)
    if out is None:
        out = _field(b"\x4a", key_value(k, v))
        if len(_ATTRIBUTES) >= _MAX_ATTRIBUTES:
            _ATTRIBUTES.clear()  # request ids and the like never recur: start afresh
        _ATTRIBUTES[memo] = out
    return out


def _name_kind(name: str, kind: int) -> bytes:
    out = _NAMES.get((name, kind))
    if out is None:
        out = _text(b"\x2a", name) + _KIND[kind]
        if len(_NAMES) < _MAX_KEYS:
            _NAMES[name, kind] = out
    return out


def span(s: Span) -> bytes:
    """One Span's body."""
    parts = [b"\x0a\x10", s.trace_id.to_bytes(16, "big"), b"\x12\x08", s.span_id.to_bytes(8, "big")]
    if s.trace_state:
        parts.append(_text(b"\x1a", s.trace_state))
    if s.parent_id:
        parts += (b"\x22\x08", s.parent_id.to_bytes(8, "big"))
    parts += (_name_kind(s.name, s.kind), _TIMES.pack(0x39, s.start, 0x41, s.end))
    parts += [_attribute(k, v) for k, v in s.attributes.items()]
    for name, t in s.events:
        parts.append(_field(b"\x5a", _EVENT_TIME.pack(0x09, t) + _text(b"\x12", name)))
    if s.status:
        message = _text(b"\x12", s.message) if s.message else b""
        parts.append(_field(b"\x7a", message + b"\x18" + _BYTE[s.status]))
    return b"".join(parts)


class Encoder:
    """Batches of one process's spans as export requests: its resource and scope written once."""

    def __init__(self, resource: Iterable[tuple[str, Value]], scope: str, version: str) -> None:
        attributes = b"".join(_field(b"\x0a", key_value(k, v)) for k, v in resource)
        self._resource = _field(b"\x0a", attributes)
        self._scope = _field(b"\x0a", _text(b"\x0a", scope) + _text(b"\x12", version))

    def request(self, spans: Sequence[Span]) -> bytes:
        """The ``ExportTraceServiceRequest`` carrying ``spans``."""
        scope_spans = self._scope + encoded(spans)
        return _field(b"\x0a", self._resource + _field(b"\x12", scope_spans))


def encoded(spans: Sequence[Span]) -> bytes:
    """``spans`` as a ScopeSpans message's ``spans`` fields: compiled where it is installed."""
    native = hotpath.native
    if native is not None:
        try:
            return native.otlp_spans(spans)
        except (TypeError, ValueError, OverflowError):
            pass  # what the compiled code does not expect, the reference decides
    return b"".join([_field(b"\x12", span(s)) for s in spans])
