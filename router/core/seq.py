"""Sequence numbers seen from one origin, bounded: for deduplicating numbered messages.

The index numbers its deltas per origin and gossip numbers the traffic it carries; both ask
the same question (seen this number before?) with the same bounded answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SeqWindow:
    """The sequence numbers seen from one origin: all up to ``floor``, and some above it.

    Bounded: when more than ``limit`` numbers wait above a gap, the floor jumps past the gap
    (a delta lost that long ago is repaired by anti-entropy, not by waiting for it).
    """

    floor: int = 0
    above: set[int] = field(default_factory=set)
    limit: int = 4096

    def add(self, seq: int) -> bool:
        """Record ``seq``; False when it was seen before."""
        if seq <= self.floor or seq in self.above:
            return False
        self.above.add(seq)
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        if len(self.above) > self.limit:
            self.floor = min(self.above)
            self.above.discard(self.floor)
            while self.floor + 1 in self.above:
                self.floor += 1
                self.above.discard(self.floor)
        return True

    def advance(self, floor: int) -> None:
        """Count every number up to ``floor`` as seen (they arrived in a snapshot)."""
        if floor <= self.floor:
            return
        self.floor = floor
        self.above = {s for s in self.above if s > floor}
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
