"""How many of the router's tokens an engine's token is: to read an engine's cache size.

The router counts a prompt's tokens by its own rule (four characters a token, or the engines'
ids in precise mode); an engine says how many of *its* tokens its cache holds
(router.gateway.fleet.scrape). A tokenizer that cuts 2.5 characters to a token makes a
cache of N engine tokens hold 0.6 N of the router's, and an index sized at N would believe
engines hold prefixes they evicted long ago. Each answered request's ``usage.prompt_tokens``
against the router's count of the same prompt says the ratio; ``TokenScale`` keeps it as a
decayed sum of both (recent traffic counts most), and says when it moved enough that the
engines' index sizes should follow. Pure, two floats and a count.
"""

from __future__ import annotations

# The decayed sums weigh about this many recent requests.
WINDOW_REQUESTS = 1000
# Fewer answered requests than this say too little to resize anything.
MIN_REQUESTS = 20
# The applied ratio follows the measured one only once they differ by more than this share.
RESIZE_ABOVE = 0.05
# A ratio outside these bounds is a broken count, not a tokenizer.
BOUNDS = (0.1, 10.0)


class TokenScale:
    """Router tokens per engine token, learnt from answered requests (1 until known)."""

    __slots__ = ("_engine", "_requests", "_router", "ratio")

    def __init__(self) -> None:
        self._router = 0.0
        self._engine = 0.0
        self._requests = 0
        self.ratio = 1.0  # as applied to the engines' index sizes

    def observe(self, router_tokens: int, engine_tokens: int) -> bool:
        """One prompt as both counted it; True when ``ratio`` changed (resize the index)."""
        if router_tokens <= 0 or engine_tokens <= 0:
            return False
        keep = 1.0 - 1.0 / WINDOW_REQUESTS
        self._router = self._router * keep + router_tokens
        self._engine = self._engine * keep + engine_tokens
        self._requests += 1
        if self._requests < MIN_REQUESTS:
            return False
        measured = min(BOUNDS[1], max(BOUNDS[0], self._router / self._engine))
        if abs(measured - self.ratio) <= RESIZE_ABOVE * self.ratio:
            return False
        self.ratio = measured
        return True

    def router_tokens(self, engine_tokens: int) -> int:
        """``engine_tokens`` in the router's own tokens."""
        return int(engine_tokens * self.ratio)
