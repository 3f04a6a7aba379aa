"""prefill-cost: the prefill queued on an engine plus this prompt's uncached part."""

from __future__ import annotations

from dataclasses import dataclass

from router.core.fields import Fields
from router.core.scorers.base import Inputs, ScorerType, falling, read_params

NAME = "prefill-cost"


@dataclass(frozen=True, slots=True)
class Params:
    """prefill-cost takes no params."""


def parse(f: Fields) -> Params:
    """The params of a ``prefill-cost`` entry (none)."""
    return read_params(Params, f)


def score(_p: Params, x: Inputs) -> list[float]:
    """Estimated time to first token: prefill queued on the engine plus this prompt's uncached part.

    1 for the cheapest candidate, falling linearly to 0 at the dearest. The queue is the
    engine's uncached prompt tokens not yet prefilled, so a cache hit on a busy engine wins
    only while the tokens it saves exceed the tokens waiting ahead of it.
    """
    pt, bt = x.prompt_tokens, x.block_tokens
    overlaps = x.scored_overlaps
    return falling(
        [q + (pt - o * bt if o * bt < pt else 0) for q, o in zip(x.tokens, overlaps, strict=True)]
    )


TYPE = ScorerType(NAME, Params, parse, score)
