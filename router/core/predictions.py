"""Provisional index entries: blocks routed to an engine whose answer has not begun.

Between the decision and the first byte of the engine's answer the router does not know that
the engine will hold the prompt, yet the engine allocates (and evicts for) it at once, and a
burst of requests behind one new prefix should land together. So ``RoutingCore.acquire`` puts
the request's blocks in the index at once, in the engine's LRU order, and notes here which of
them the engine was not already believed to hold: those entries are *provisional*. They are
never gossiped. The first byte confirms them (``RoutingCore.record`` publishes the delta); a
failed attempt withdraws them (``RoutingCore.release``), so a failure leaves no belief behind.

Claims are counted per (engine, key): two attempts may claim one block, and the block leaves
the index only when the last claim is withdrawn and no answer confirmed it. Bounded by
construction: claims exist only for attempts in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from router.core import hotpath


class Predictions:
    """Per engine, the provisional block keys and how many attempts claim each."""

    def __init__(self) -> None:
        self._claims: dict[str, dict[int, int]] = {}

    def claim(self, engine: str, keys: Iterable[int]) -> None:
        t = self._claims.setdefault(engine, {})
        native = hotpath.native
        if native is not None:
            native.claim(t, keys)
        else:
            for k in keys:
                t[k] = t.get(k, 0) + 1
        if not t:
            del self._claims[engine]

    def confirm(self, engine: str, keys: Iterable[int]) -> None:
        """The engine answered a prompt with ``keys``: none of them is provisional any more."""
        t = self._claims.get(engine)
        if t is None:
            return
        native = hotpath.native
        if native is not None:
            native.discard(t, keys)
        else:
            for k in keys:
                t.pop(k, None)
        if not t:
            del self._claims[engine]

    def withdraw(self, engine: str, keys: Iterable[int]) -> list[int]:
        """Drop one claim on each of ``keys``; the keys no attempt claims any more."""
        t = self._claims.get(engine)
        if t is None:
            return []
        native = hotpath.native
        if native is not None:
            gone = native.withdraw(t, keys)
            if not t:
                del self._claims[engine]
            return gone
        gone = []
        for k in keys:
            n = t.get(k)
            if n is None:
                continue  # confirmed meanwhile
            if n > 1:
                t[k] = n - 1
            else:
                del t[k]
                gone.append(k)
        if not t:
            del self._claims[engine]
        return gone

    def claimed(self, engine: str, keys: Sequence[int]) -> tuple[int, ...]:
        """Of ``keys``, those some attempt in flight claims on ``engine``.

        Every decision asks this of each holder while requests are in flight: a set
        intersection runs in C (a chain's keys are distinct, so none is counted twice).
        """
        t = self._claims.get(engine)
        return tuple(t.keys() & keys) if t else ()

    def count(self, engine: str, keys: Sequence[int]) -> int:
        """How many of ``keys`` are provisional on ``engine``."""
        return len(self.claimed(engine, keys))

    def clear(self) -> None:
        self._claims.clear()

    def __bool__(self) -> bool:
        return bool(self._claims)

    def __len__(self) -> int:
        """Entries: (engine, key) pairs with at least one claim."""
        return sum(len(t) for t in self._claims.values())
