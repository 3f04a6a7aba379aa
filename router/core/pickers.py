"""Pickers: the last step of a decision, choosing one engine among the scored candidates.

Each picker is a function of one ``Choice`` registered by its kebab-case name in ``PICKERS``,
with whether it reads the scorers (a policy with a picker that ignores them must not list any).
Every picker that can fall back to scores breaks ties on the ring, so that every replica
makes the same pick and a new prefix lands on its consistent-hash home.

- ``max-score``: the best weighted score among the eligible candidates.
- ``round-robin``: the candidates in turn (``RoutingCore.acquire`` moves the turn on).
- ``ring``: the request's consistent-hash home, walking past ineligible engines.

Whatever the picker but round-robin, ``cold_prefix: ring`` sends a prefix nobody holds to its
ring home.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.core import hotpath
from router.core.ring import BoundedLoadRing
from router.core.scorers.base import Inputs

ROUND_ROBIN = "round-robin"
RING = "ring"


@dataclass(frozen=True, slots=True)
class Choice:
    """What a picker sees: the scored candidates and the ring that breaks ties."""

    inputs: Inputs
    eligible: Sequence[bool]
    totals: Sequence[float]
    ring_key: int  # the request's first block nobody holds (or its namespace's seed)
    ring: BoundedLoadRing
    turn: int  # round-robin's position
    cold_ring: bool  # ``cold_prefix: ring``


Pick = tuple[str | None, str]  # the engine (None: no candidates) and the reason


@dataclass(frozen=True, slots=True)
class PickerType:
    """One registered picker: its name, whether it reads the scores, and its function."""

    name: str
    scored: bool
    pick: Callable[[Choice], Pick]


def best(c: Choice) -> str:
    """The eligible candidate with the highest total (all of them when none is eligible);
    a tie goes to the first of the tied on the ring from the request's key."""
    eligible, totals = c.eligible, c.totals
    if all(eligible):
        top = max(totals)
        tied = [i for i, t in enumerate(totals) if t >= top - 1e-12]
    else:
        idx = [i for i, ok in enumerate(eligible) if ok] or list(range(len(totals)))
        top = max([totals[i] for i in idx])
        tied = [i for i in idx if totals[i] >= top - 1e-12]
    cands = c.inputs.candidates
    if len(tied) == 1:
        return cands[tied[0]]
    names = {cands[i] for i in tied}
    home = c.ring.home(c.ring_key, names.__contains__)
    return home if home is not None else min(names)


def ranked(eligible: Sequence[bool], totals: Sequence[float], requests: Sequence[int]) -> list[int]:
    """The candidates' positions, best first: the eligible before the rest, then by total,
    then the least loaded (the order a decision's fallbacks are tried in)."""
    native = hotpath.native
    if native is not None:
        try:
            return native.rank(eligible, totals, requests)
        except (OverflowError, TypeError):  # past 64-bit figures, or NaN: Python's sort
            pass
    return sorted(range(len(totals)), key=lambda i: (not eligible[i], -totals[i], requests[i]))


def _home(c: Choice, reason: str) -> Pick:
    ok = {e for e, fine in zip(c.inputs.candidates, c.eligible, strict=True) if fine}
    home = c.ring.home(c.ring_key, ok.__contains__)
    if home is None:  # engines that are candidates but not (yet) on the ring
        home = best(c)
    return home, reason


def _cold(c: Choice) -> bool:
    return c.cold_ring and not any(c.inputs.overlaps)


def max_score(c: Choice) -> Pick:
    """The best weighted score (a cold prefix to its ring home with ``cold_prefix: ring``)."""
    if not c.inputs.candidates:
        return None, "no-candidates"
    if _cold(c):
        return _home(c, "cold-prefix-ring")
    return best(c), "best-score"


def round_robin(c: Choice) -> Pick:
    """The next candidate after the last one a round-robin decision sent a request to."""
    cands = c.inputs.candidates
    if not cands:
        return None, "no-candidates"
    return cands[(c.turn + 1) % len(cands)], ROUND_ROBIN


def ring(c: Choice) -> Pick:
    """The request's consistent-hash home among the eligible candidates."""
    if not c.inputs.candidates:
        return None, "no-candidates"
    return _home(c, RING)


PICKERS: Mapping[str, PickerType] = {
    t.name: t
    for t in (
        PickerType("max-score", True, max_score),
        PickerType(ROUND_ROBIN, False, round_robin),
        PickerType("ring", False, ring),
    )
}
PICKER_TYPES: tuple[str, ...] = tuple(PICKERS)
