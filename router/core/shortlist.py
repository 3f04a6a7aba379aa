"""Which candidates a large fleet's decision scores: the few that could win.

Scoring every engine costs a decision time linear in the fleet. Only these can come out on
top: the engines holding the deepest part of the prefix, the least loaded eligible ones of
the rest, the engine the session went to last, and, for a prefix nobody holds, its ring home
(the tie-break among equally idle engines). Every other candidate holds none of the prefix
and carries at least the spares' load, so a scorer would rank it no better than they.
Replicas with the same view choose the same shortlist.

``shortlist`` reads every candidate once: its passes run compiled (``core.hotpath``), or in
the reference over C-level builtins (``compress``, ``filterfalse`` and ``map`` over built-in
methods); only the few kept are looked at in Python.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import compress, filterfalse

from router.core import hotpath

HOLDERS = 8  # at most this many holders of the prefix: the deepest, then the least loaded
SPARES = 4  # this many of the least loaded eligible engines that hold none of it

RingHome = Callable[[int, Callable[[str], bool]], "str | None"]


def shortlist(
    cands: Sequence[str],
    overlaps: Sequence[int],
    requests: Sequence[int],
    eligible: Sequence[bool],
    session_engine: str | None,
    ring_key: int,
    ring_home: RingHome,
) -> list[int]:
    """Positions in ``cands`` worth scoring, in candidate order.

    The lists are per candidate: leading blocks held, in-flight requests, admitted by the
    bounded-load filter. ``ring_home(ring_key, admit)`` is the ring's home for a prefix
    nobody holds, asked only when more engines tie with the idlest spare than are kept (a
    walk of the ring costs more than scoring a few engines).
    """
    native = hotpath.native
    if native is not None:
        try:
            kept, tie = native.shortlist(overlaps, requests, eligible, HOLDERS, SPARES)
        except OverflowError:  # figures past 64 bits: the reference copes with any int
            pass
        else:
            extra = []
            if session_engine is not None and session_engine in cands:
                extra.append(cands.index(session_engine))
            if tie:
                home = _ring_home(cands, eligible, ring_key, ring_home)
                if home is not None:
                    extra.append(home)
            return sorted({*kept, *extra}) if extra else kept
    n = len(cands)
    keep: set[int] = set()
    held = list(compress(range(n), overlaps))
    holders = held
    if len(held) > HOLDERS:
        holders = heapq.nsmallest(HOLDERS, held, key=lambda i: (-overlaps[i], requests[i]))
    keep.update(holders)
    free = list(filterfalse(set(held).__contains__, compress(range(n), eligible)))
    # A stable sort: among equally loaded spares, the first candidates.
    spares = sorted(free, key=requests.__getitem__)[:SPARES]
    keep.update(spares)
    if session_engine is not None and session_engine in cands:
        keep.add(cands.index(session_engine))
    if not held and spares:
        low = requests[spares[0]]
        if list(map(requests.__getitem__, free)).count(low) > len(spares):
            home = _ring_home(cands, eligible, ring_key, ring_home)
            if home is not None:
                keep.add(home)
    return sorted(keep)


def _ring_home(
    cands: Sequence[str], eligible: Sequence[bool], ring_key: int, ring_home: RingHome
) -> int | None:
    """The position of the ring's home for ``ring_key`` among the eligible candidates."""
    pos = dict(zip(cands, range(len(cands)), strict=True))
    home = ring_home(ring_key, lambda e: e in pos and eligible[pos[e]])
    return None if home is None else pos[home]


def narrow(
    keep: list[int],
    cands: list[str],
    overlaps: list[int],
    requests: list[int],
    eligible: list[bool],
) -> tuple[list[str], list[str], list[int], list[int], list[bool]]:
    """The candidates left out of ``keep`` (in order), then each list at ``keep``'s positions."""
    native = hotpath.native
    if native is not None:
        unscored, (c, o, r, e) = native.narrow(keep, cands, (cands, overlaps, requests, eligible))
        return unscored, c, o, r, e
    kept = {cands[i] for i in keep}
    return (
        list(filterfalse(kept.__contains__, cands)),
        [cands[i] for i in keep],
        [overlaps[i] for i in keep],
        [requests[i] for i in keep],
        [eligible[i] for i in keep],
    )
