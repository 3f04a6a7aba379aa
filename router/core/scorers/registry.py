"""The scorer types a policy may name, by kebab-case type name: one line per type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.core.scorers import load, prefill_cost, prefix_overlap, session_affinity, ttft_estimate
from router.core.scorers.base import ScorerType

SCORERS: Mapping[str, ScorerType[Any]] = {
    t.name: t
    for t in (
        prefix_overlap.TYPE,
        prefill_cost.TYPE,
        ttft_estimate.TYPE,
        load.TYPE,
        session_affinity.TYPE,
    )
}
SCORER_TYPES: tuple[str, ...] = tuple(SCORERS)
