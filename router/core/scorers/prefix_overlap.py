"""prefix-overlap: the share of the request's blocks an engine already holds."""

from __future__ import annotations

from dataclasses import dataclass

from router.core import hotpath
from router.core.fields import Fields
from router.core.scorers.base import Inputs, ScorerType, read_params

NAME = "prefix-overlap"


@dataclass(frozen=True, slots=True)
class Params:
    """prefix-overlap takes no params."""


def parse(f: Fields) -> Params:
    """The params of a ``prefix-overlap`` entry (none)."""
    return read_params(Params, f)


def score(_p: Params, x: Inputs) -> list[float]:
    """The share of the request's blocks the engine already holds; while some candidate could
    start the request at once, divided by one more than the batch slots it would wait for.

    Keeping a prefix on one engine saves cache space, but not at the price of a queue: when
    the engines holding a hot prefix have full batches and another could start the request at
    once, the prefix may spread (ttft-estimate weighs the extra prefill against the wait).
    When every engine would make it wait, the fleet is saturated and holding on to the
    prefix counts in full again (spreading it then costs hits and saves no wait).
    """
    if not x.blocks:
        return [0.0] * len(x.candidates)
    n = x.blocks
    overlaps = x.scored_overlaps
    waiting = x.waiting if x.waiting and not min(x.waiting) else ()
    native = hotpath.native
    if native is not None:
        try:
            return native.shares(overlaps, n, waiting)
        except (OverflowError, TypeError):  # ints past 2**53: the reference divides them exactly
            pass
    if not waiting:
        return [o / n for o in overlaps]
    return [o / n / (1 + w) for o, w in zip(overlaps, waiting, strict=True)]


TYPE = ScorerType(NAME, Params, parse, score)
