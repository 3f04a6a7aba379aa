"""A request's W3C trace context, and the head sampler's verdict on it.

The client's ``traceparent`` and ``tracestate`` are read here, the sampler decides from the ids
alone as OpenTelemetry's samplers of the same names do, and the header an engine gets is
formatted directly (tests/gateway/tracing/test_context.py holds all three to the SDK's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# version-trace_id-parent_id-flags; a later version may append fields, version 00 may not.
_TRACEPARENT = re.compile(
    r"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$"
)
# Longer values are ignored, as the SDK's propagator ignores them.
MAX_TRACEPARENT = 512
_LOW_64 = (1 << 64) - 1
# tracestate: list members key=value (W3C Trace Context, section 3.3.1), at most 32.
_STATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
MAX_STATE_MEMBERS = 32


@dataclass(frozen=True, slots=True)
class Parent:
    """The client's span, as its ``traceparent`` names it."""

    trace_id: int
    span_id: int
    sampled: bool


def parent_of(headers: Mapping[str, str]) -> Parent | None:
    """The parent a valid ``traceparent`` names; None when there is none or it is invalid."""
    value = headers.get("traceparent")
    if not value or len(value) > MAX_TRACEPARENT:
        return None
    m = _TRACEPARENT.match(value)
    if m is None:
        return None
    version, trace_id, span_id, flags, more = m.groups()
    if version == "ff" or (version == "00" and more):
        return None
    parent = Parent(int(trace_id, 16), int(span_id, 16), bool(int(flags, 16) & 1))
    return parent if parent.trace_id and parent.span_id else None


class HeadSampler:
    """``always_on``, ``always_off``, ``traceidratio`` and their ``parentbased_`` forms."""

    __slots__ = ("_bound", "_parent_based")

    def __init__(self, name: str, ratio: float) -> None:
        self._parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        # Each root sampler is a bound on the trace id's low 64 bits: all of them, none, or
        # the ratio's share (the SDK's arithmetic, so that both agree on every id).
        bounds = {
            "always_on": _LOW_64 + 1,
            "always_off": 0,
            "traceidratio": round(ratio * (_LOW_64 + 1)),
        }
        self._bound = bounds[root]

    def sampled(self, parent: Parent | None, trace_id: int) -> bool:
        """Whether the request of ``trace_id`` (under ``parent``, if any) is sampled."""
        if self._parent_based and parent is not None:
            return parent.sampled
        return trace_id & _LOW_64 < self._bound


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    """The version-00 ``traceparent`` naming a span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def tracestate_of(headers: Mapping[str, str]) -> str:
    """The client's ``tracestate``, normalised; "" when absent or invalid (all or nothing)."""
    value = headers.get("tracestate")
    if not value:
        return ""
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    keys = set()
    for m in members:
        match = _STATE_MEMBER.fullmatch(m)
        if match is None or match[1] in keys:
            return ""
        keys.add(match[1])
    return ",".join(members) if len(members) <= MAX_STATE_MEMBERS else ""
