"""The generated protocol messages, and the few helpers every module needs around them.

The messages come from proto/gossip.proto, generated into ``router.gossip.pb`` by
``make proto`` and committed with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from router.gossip.pb import gossip_pb2 as pb

__all__ = [
    "EXCHANGE_PATH",
    "PROTOCOL_VERSION",
    "SERVICE",
    "digest_map",
    "group_ids",
    "pb",
    "to_digest",
]

PROTOCOL_VERSION = 1
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
