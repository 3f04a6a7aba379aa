"""Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018).

A prefix nobody holds yet goes to its home on a ring of engines. Every router replica builds
the same ring from the same engine names, so replicas place a new prefix on the same engine
before gossip has told them about each other's choices. The walk passes engines whose load is
over the cap ``(1 + epsilon) x mean``, which bounds any engine's share of a hot key's traffic;
Mirrokni et al. show that with this cap, adding or removing an engine still moves only about
1/N of the keys, plus an O(1/epsilon^2) factor for keys pushed past full engines.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import xxhash
from uhashring import HashRing

from router.core import hotpath


def _hash(key: object) -> int:
    return xxhash.xxh3_64_intdigest(str(key).encode())


class BoundedLoadRing:
    """A ring of weighted engines (``vnodes`` points per unit of weight) walked from a key."""

    def __init__(self, vnodes: int = 160) -> None:
        self.vnodes = vnodes
        self._weights: dict[str, int] = {}
        self._ring = HashRing(nodes={}, hash_fn=_hash, vnodes=vnodes)
        # The ring's points in order and their engines, copied out when the ring changes: a
        # walk bisects them and stops at the first admitted engine. uhashring's own walk
        # copies the tail of its point list first (40,960 points at 256 engines): 170 us a
        # walk, more than the rest of a decision.
        self._points: list[int] = []
        self._owners: list[str] = []

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self._weights)

    def set_engines(self, weights: Mapping[str, int]) -> None:
        """Make the ring hold exactly ``weights``' engines; unchanged engines keep their points."""
        changed = False
        for gone in set(self._weights) - set(weights):
            self._ring.remove_node(gone)
            del self._weights[gone]
            changed = True
        for engine, weight in weights.items():
            if self._weights.get(engine) != weight:
                if engine in self._weights:
                    self._ring.remove_node(engine)
                self._ring.add_node(engine, {"weight": weight, "vnodes": self.vnodes})
                self._weights[engine] = weight
                changed = True
        if changed:
            points = self._ring.get_points()
            self._points = [point for point, _ in points]
            self._owners = [engine for _, engine in points]

    def walk(self, key: int) -> Iterator[str]:
        """Every engine once, in ring order from ``key``'s position (uhashring's order: the
        first point above the key's hash, wrapping to the start)."""
        points, owners, n = self._points, self._owners, len(self._points)
        start = bisect.bisect(points, _hash(key)) % n if n else 0
        seen: set[str] = set()
        for i in itertools.chain(range(start, n), range(start)):
            engine = owners[i]
            if engine not in seen:
                seen.add(engine)
                yield engine
                if len(seen) == len(self._weights):
                    return

    def home(self, key: int, admit: Callable[[str], bool] = lambda _e: True) -> str | None:
        """The first engine from ``key`` that ``admit`` accepts (None when none does)."""
        for engine in self.walk(key):
            if admit(engine):
                return engine
        return None


def load_cap(total: float, engines: int, epsilon: float, weight: float = 1.0) -> float:
    """The most load one engine may carry after taking ``weight`` more: ceil((1+eps) x mean).

    ``total`` is the fleet's load before this placement. Rounding up (for integer loads) keeps
    at least one engine admissible: the least loaded is at or below the mean.
    """
    if engines <= 0:
        return 0.0
    return float(math.ceil((1.0 + epsilon) * (total + weight) / engines))


def under_cap(loads: Sequence[int], weight: int, epsilon: float, min_cap: int) -> list[bool]:
    """Per engine, whether it stays under the cap after taking ``weight`` more load.

    The least loaded engine always stays admissible: with token loads one request can
    outweigh the whole margin, and a cap that admits nobody would route nowhere. The cap is
    never below ``min_cap`` requests' worth of ``weight``.
    """
    native = hotpath.native
    if native is not None:
        try:
            return native.under_cap(loads, weight, epsilon, min_cap)
        except (OverflowError, TypeError):  # past 2**53, or not ints: the reference copes
            pass
    if not loads:
        return []
    floor = max(min(loads) + weight, min_cap * weight)
    cap = max(load_cap(sum(loads), len(loads), epsilon, weight), floor)
    # v + weight <= cap for every (integer) load v, as one pass over C-level builtins.
    limit = math.floor(cap) - weight
    return list(map(limit.__ge__, loads))
