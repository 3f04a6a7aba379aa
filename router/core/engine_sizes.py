"""The engines' own cache sizes, as the index's capacity for each of them.

An engine that says how many prompt tokens its prefix cache holds (router.gateway.fleet.scrape)
gets that capacity in the index instead of the policy's guess, so the index forgets its blocks
when the engine does. The engine counts in its own tokens: ``TokenScale`` (``core.token_scale``)
turns them into the router's, and when it learns a new ratio every reported size is read again.
The sizes outlive an index rebuilt for a new block size: ``apply`` puts them on the new one.
"""

from __future__ import annotations

from router.core.index import BlockIndex
from router.core.token_scale import TokenScale


class EngineSizes:
    """Per engine, the prompt tokens it says it caches (its own tokens), and their scale."""

    __slots__ = ("_tokens", "scale")

    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}
        self.scale = TokenScale()

    def said(self, index: BlockIndex, block_tokens: int, engine: str, tokens: int) -> None:
        """``engine`` caches ``tokens`` of its tokens: its capacity in ``index`` from now on
        (nothing is kept for an engine the index does not track)."""
        if engine not in index.engines or tokens < 1:
            return
        self._tokens[engine] = tokens
        self._size(index, block_tokens, engine)

    def calibrate(
        self, index: BlockIndex, block_tokens: int, router_tokens: int, engine_tokens: int
    ) -> None:
        """An answered prompt as the router counted it and as its engine did: when the two
        counts part, every reported size is read again in the router's tokens."""
        if self.scale.observe(router_tokens, engine_tokens):
            self.apply(index, block_tokens)

    def apply(self, index: BlockIndex, block_tokens: int) -> None:
        """Every reported size onto ``index`` (a new one, or blocks of another size)."""
        for engine in self._tokens:
            self._size(index, block_tokens, engine)

    def forget(self, engine: str) -> None:
        """``engine`` left the fleet: back with the policy's size until it says again."""
        self._tokens.pop(engine, None)

    def _size(self, index: BlockIndex, block_tokens: int, engine: str) -> None:
        tokens = self.scale.router_tokens(self._tokens[engine])
        index.add_engine(engine, max(1, tokens // block_tokens))
