"""The application's hooks into a gossip node (memberlist's Delegate).

The node moves versioned messages and decides what is new; the delegate owns what they mean:
it hands over local changes, merges remote ones, and exports and restores snapshots. Every
hook is synchronous and quick: it runs on the event loop between network operations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from router.gossip.wire import pb


class Delegate(Protocol):
    """What a gossip node asks of the application."""

    def local_deltas(self, limit: int) -> list[pb.Delta]:
        """Up to ``limit`` local deltas queued since the last call, oldest first."""
        ...

    def local_load(self) -> list[pb.EngineLoad]:
        """This replica's current in-flight load per engine."""
        ...

    def local_heat(self) -> list[pb.PrefixHeat]:
        """This replica's hottest prefixes: requests in flight behind each (a bounded few)."""
        ...

    def merge_delta(self, delta: pb.Delta) -> None:
        """Merge a remote delta the node has not delivered before."""
        ...

    def merge_load(
        self, origin: str, engines: Sequence[pb.EngineLoad], prefixes: Sequence[pb.PrefixHeat]
    ) -> None:
        """Replace ``origin``'s load figures (and its hottest prefixes) with a newer report."""
        ...

    def forget_load(self, origin: str) -> None:
        """Drop ``origin``'s load figures (it died, left, or stopped reporting)."""
        ...

    def export_blocks(self, chunk_bytes: int) -> Iterator[list[pb.EngineBlocks]]:
        """The whole state as chunks of at most about ``chunk_bytes`` each."""
        ...

    def restore_blocks(self, engines: Sequence[pb.EngineBlocks]) -> None:
        """Merge one snapshot chunk's blocks."""
        ...

    def mark_seen(self, floors: Mapping[str, int]) -> None:
        """A restored snapshot covers every delta up to ``floors[origin]``."""
        ...
