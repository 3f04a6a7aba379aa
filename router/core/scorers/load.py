"""load: the idlest candidate scores 1, the busiest 0, by requests or prompt tokens."""

from __future__ import annotations

from dataclasses import dataclass

from router.core.fields import Fields
from router.core.scorers.base import (
    LOAD_METRICS,
    Inputs,
    LoadMetric,
    ScorerType,
    falling,
    param,
    read_params,
)

NAME = "load"


@dataclass(frozen=True, slots=True)
class Params:
    """``metric``: in-flight requests, or prompt tokens sent and not yet prefilled."""

    metric: LoadMetric = param("requests", choices=LOAD_METRICS)  # noqa: RUF009 (a field)


def parse(f: Fields) -> Params:
    """The params of a ``load`` entry."""
    return read_params(Params, f)


def score(p: Params, x: Inputs) -> list[float]:
    """1 for the idlest candidate, falling linearly to 0 for the busiest."""
    return falling(x.requests if p.metric == "requests" else x.tokens)


TYPE = ScorerType(NAME, Params, parse, score)
