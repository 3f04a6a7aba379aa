"""Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018).

A prefix nobody holds yet goes to its home on a ring of engines. Every router replica builds
the same ring from the same engine names, so replicas place a new prefix on the same engine
before gossip has told them about each other's choices. The walk passes engines whose load is
over the cap ``(1 + epsilon) x mean``, which bounds any engine's share of a hot key's traffic;
Mirrokni et al. show that with this cap, adding or removing an engine still moves only about
1/N of the keys, plus an O(1/epsilon^2) factor for keys pushed past full engines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import xxhash
from uhashring import HashRing


def _hash(key: object) -> int:
    return xxhash.xxh3_64_intdigest(str(key).encode())


class BoundedLoadRing:
    """A ring of weighted engines (``vnodes`` points per unit of weight) walked from a key."""

    def __init__(self, vnodes: int = 160) -> None:
        self.vnodes = vnodes
        self._weights: dict[str, int] = {}
        self._ring = HashRing(nodes={}, hash_fn=_hash, vnodes=vnodes)

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self._weights)

    def set_engines(self, weights: Mapping[str, int]) -> None:
        """Make the ring hold exactly ``weights``' engines; unchanged engines keep their points."""
        for gone in set(self._weights) - set(weights):
            self._ring.remove_node(gone)
            del self._weights[gone]
        for engine, weight in weights.items():
            if self._weights.get(engine) != weight:
                if engine in self._weights:
                    self._ring.remove_node(engine)
                self._ring.add_node(engine, {"weight": weight, "vnodes": self.vnodes})
                self._weights[engine] = weight

    def walk(self, key: int) -> Iterator[str]:
        """Every engine once, in ring order from ``key``'s position."""
        if not self._weights:
            return iter(())
        return (node["nodename"] for node in self._ring.range(key, unique=True))

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
