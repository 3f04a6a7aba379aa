"""In-flight load per engine: what this replica has sent, plus what its peers report.

The bounded-load cap and the load scorers must see the whole fleet's load, not one replica's
share of it, so peers' figures (per origin, replaced wholesale by each report) are summed with
the local counters. A peer that dies takes its figures with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Load:
    """In-flight requests and in-flight prompt tokens."""

    requests: int = 0
    tokens: int = 0


ZERO = Load()


class LoadBook:
    """Local in-flight counters per engine and the latest report from each peer."""

    def __init__(self) -> None:
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._remote: dict[str, Mapping[str, Load]] = {}
        # Sum of all peers' reports per engine, rebuilt when a report arrives, so that
        # reading a load on the routing path costs two dict lookups.
        self._remote_sum: dict[str, Load] = {}

    def acquire(self, engine: str, tokens: int) -> None:
        self._requests[engine] = self._requests.get(engine, 0) + 1
        self._tokens[engine] = self._tokens.get(engine, 0) + tokens

    def release(self, engine: str, tokens: int) -> None:
        """Give back what ``acquire`` took; counters never go below zero."""
        n = self._requests.get(engine, 0) - 1
        t = self._tokens.get(engine, 0) - tokens
        if n <= 0:
            self._requests.pop(engine, None)
            self._tokens.pop(engine, None)
        else:
            self._requests[engine] = n
            self._tokens[engine] = max(0, t)

    def local(self, engine: str) -> Load:
        return Load(self._requests.get(engine, 0), self._tokens.get(engine, 0))

    def local_all(self) -> dict[str, Load]:
        return {e: Load(n, self._tokens.get(e, 0)) for e, n in self._requests.items()}

    def requests(self, engines: Iterable[str]) -> list[int]:
        """Fleet-wide in-flight requests for each of ``engines``, in order."""
        loc, rem = self._requests, self._remote_sum
        if not rem:
            return [loc.get(e, 0) for e in engines]
        return [loc.get(e, 0) + rem.get(e, ZERO).requests for e in engines]

    def tokens(self, engines: Iterable[str]) -> list[int]:
        """Fleet-wide in-flight prompt tokens for each of ``engines``, in order."""
        loc, rem = self._tokens, self._remote_sum
        if not rem:
            return [loc.get(e, 0) for e in engines]
        return [loc.get(e, 0) + rem.get(e, ZERO).tokens for e in engines]

    def total(self, engine: str) -> Load:
        r = self._remote_sum.get(engine, ZERO)
        return Load(
            self._requests.get(engine, 0) + r.requests, self._tokens.get(engine, 0) + r.tokens
        )

    def report(self, origin: str, loads: Mapping[str, Load]) -> None:
        """Replace peer ``origin``'s figures with its latest report."""
        self._remote[origin] = dict(loads)
        self._resum()

    def forget(self, origin: str) -> None:
        """Drop a peer's figures (it died or left)."""
        if self._remote.pop(origin, None) is not None:
            self._resum()

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(self._remote)

    def _resum(self) -> None:
        req: dict[str, int] = {}
        tok: dict[str, int] = {}
        for loads in self._remote.values():
            for e, ld in loads.items():
                req[e] = req.get(e, 0) + ld.requests
                tok[e] = tok.get(e, 0) + ld.tokens
        self._remote_sum = {e: Load(n, tok[e]) for e, n in req.items()}
