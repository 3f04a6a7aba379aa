"""The generated protocol messages, and the few helpers every module needs around them.

The messages come from proto/gossip.proto, generated into ``router.gossip.pb`` by
``make proto`` and committed with it. Besides the protocol's constants, the helpers here only
convert between the wire's shapes and this library's values: delta ids grouped by origin,
digests as ``{origin: seq}``, and members of the SWIM table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from router.gossip.membership import Member, State
from router.gossip.pb import gossip_pb2 as pb

__all__ = [
    "EXCHANGE_PATH",
    "PROTOCOL_VERSION",
    "SERVICE",
    "digest_map",
    "group_ids",
    "member_from_pb",
    "member_to_pb",
    "pb",
    "to_digest",
]

# Version 2 binds every frame to its recipient (proto/gossip.proto, Recipients and Versions).
PROTOCOL_VERSION = 2
# The fully qualified gRPC method path, from the proto itself so the two cannot drift.
SERVICE = pb.DESCRIPTOR.services_by_name["Gossip"].full_name
EXCHANGE_PATH = f"/{SERVICE}/Exchange"


def group_ids(ids: Iterable[tuple[str, int]]) -> list[pb.DeltaIds]:
    """Delta ids grouped by origin, each origin once, in first-seen order."""
    by_origin: dict[str, list[int]] = {}
    for origin, seq in ids:
        by_origin.setdefault(origin, []).append(seq)
    return [pb.DeltaIds(origin=o, seqs=s) for o, s in by_origin.items()]


def to_digest(entries: Mapping[str, int]) -> list[pb.OriginSeq]:
    return [pb.OriginSeq(origin=o, seq=s) for o, s in entries.items()]


def digest_map(entries: Iterable[pb.OriginSeq]) -> dict[str, int]:
    return {e.origin: e.seq for e in entries}


_PB_STATES: dict[State, pb.MemberState] = {
    State.ALIVE: pb.MEMBER_STATE_ALIVE,
    State.SUSPECT: pb.MEMBER_STATE_SUSPECT,
    State.DEAD: pb.MEMBER_STATE_DEAD,
}
_STATES: dict[int, State] = {int(v): k for k, v in _PB_STATES.items()}


def member_to_pb(m: Member) -> pb.Member:
    """The rumour that spreads ``m`` (its local ``since`` stays behind)."""
    return pb.Member(
        id=m.id, address=m.address, incarnation=m.incarnation, state=_PB_STATES[m.state]
    )


def member_from_pb(m: pb.Member) -> Member | None:
    """The member a rumour describes; None when it names no one or an unknown state."""
    state = _STATES.get(m.state)
    if not m.id or state is None:
        return None
    return Member(m.id, m.address, m.incarnation, state)
