"""Which engine stored which response: where a stateful Responses request must go.

A Responses request that names ``previous_response_id`` continues a conversation the engine
that answered it keeps in its own store; no other engine can serve it. ``ResponseHomes``
remembers each response id the gateway saw answered, with its engine, in recency order and
bounded (``capacity`` ids, about 200 bytes each: 100,000 are some 20 MB), and narrows a
request's candidates to that engine. A response older than the last ``capacity`` is forgotten,
as an engine's store forgets too.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_CAPACITY = 100_000
# Longer ids are no engine's: not remembered (they would only take memory).
MAX_ID_CHARS = 256


class ResponseHomes:
    """Response id -> the engine that stored it, bounded, least recently used first out."""

    __slots__ = ("_homes", "capacity")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._homes: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._homes)

    def learn(self, response_id: str, engine: str) -> None:
        """``engine`` answered ``response_id`` (and holds it, if it stores responses)."""
        if not response_id or len(response_id) > MAX_ID_CHARS:
            return
        homes = self._homes
        homes.pop(response_id, None)
        homes[response_id] = engine
        if len(homes) > self.capacity:
            del homes[next(iter(homes))]

    def home(self, response_id: str) -> str | None:
        """The engine that answered ``response_id``, or None when it is not known."""
        engine = self._homes.pop(response_id, None)
        if engine is not None:
            self._homes[response_id] = engine  # recently used: the conversation goes on
        return engine

    def candidates(self, response_id: str, candidates: Sequence[str]) -> tuple[str, ...]:
        """Of ``candidates``, the one that holds ``response_id``: () when none does (it is not
        known, or its engine no longer serves the model)."""
        engine = self.home(response_id)
        return (engine,) if engine is not None and engine in candidates else ()
