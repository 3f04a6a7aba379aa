"""A routing decision as a value: where a request goes, where next if that fails, and why.

``RoutingCore.decide`` (``core.decision``) makes it and changes nothing; the gateway and the
simulator try ``plan()`` in order, and ``explain()`` is what ``POST /debug/route`` answers.

What it says of routing quality, in the request's text blocks (``believed_tokens`` turns them
into the router's token estimate): the deepest prefix any candidate holds (``deepest``), the
deepest an eligible one holds (``reachable``), why the pick holds less than the deepest
(``not_deepest``, one of ``NOT_DEEPEST``), and where the request's prefix leaves what the
fleet holds (``divergence``):

- ``cap``: every deepest holder is over the bounded-load cap;
- ``policy``: the picker does not weigh overlap (round-robin, ring);
- ``spread``: the prefix is hot, and every candidate was credited with holding it;
- ``session``: the pick is where the request's session went last (session-affinity);
- ``flow_control``: every eligible deepest holder reports requests waiting for a batch slot
  (full, as flow control judges engines by their own reports);
- ``load``: otherwise: the scorers preferred a less loaded engine over the deeper holder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.core.pickers import RING, ROUND_ROBIN
from router.core.scorers.base import Inputs

NOT_DEEPEST: tuple[str, ...] = ("cap", "policy", "spread", "session", "flow_control", "load")
_UNSCORED_PICKS = frozenset({ROUND_ROBIN, RING})


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes, where next if that fails, and why; ``engine`` None: nowhere."""

    engine: str | None
    reason: str
    keys: tuple[int, ...]
    prompt_tokens: int
    inputs: Inputs
    # Per candidate, in ``inputs.candidates`` order: of its overlap, the provisional blocks.
    predicted: tuple[int, ...]
    eligible: tuple[bool, ...]
    scores: Mapping[str, tuple[float, ...]]
    totals: tuple[float, ...]
    # The other candidates, best first: eligible before ineligible, then by score.
    fallbacks: tuple[str, ...]
    session: str | None = None
    # Per candidate: where its overlap came from (event, predicted, approximate, none).
    sources: tuple[str, ...] = ()
    # The key of the deepest prefix some candidate holds: requests in flight per key are
    # its heat (``HotPrefix``). None: nobody holds any of the prompt.
    prefix: int | None = None
    block_chars: int = 0  # characters per block, to place a block in the routing text
    # For a conversation's follow-up turn (``core.turns``): the block where its prefix left
    # the previous turn's. None: it did not, or no previous turn is known.
    broken_at: int | None = None

    def plan(self) -> tuple[str, ...]:
        """The engines to try, in order: the pick, then the fallbacks."""
        return () if self.engine is None else (self.engine, *self.fallbacks)

    def overlap_of(self, engine: str) -> int:
        """Leading blocks ``engine`` held (or was predicted to) when the decision was made."""
        x = self.inputs
        return x.overlaps[x.candidates.index(engine)] if engine in x.candidates else 0

    def source_of(self, i: int) -> str:
        """Where candidate ``i``'s overlap came from."""
        if self.sources:
            return self.sources[i]
        return "approximate" if self.inputs.overlaps[i] else "none"

    @property
    def overlap_ratio(self) -> float:
        """The share of the request's blocks the chosen engine held."""
        if self.engine is None or not self.keys:
            return 0.0
        return self.overlap_of(self.engine) / len(self.keys)

    @property
    def deepest(self) -> int:
        """Leading blocks the deepest holder among the candidates holds."""
        return max(self.inputs.overlaps, default=0)

    @property
    def reachable(self) -> int:
        """Leading blocks the deepest eligible candidate holds (any, when none is eligible)."""
        if all(self.eligible):
            return self.deepest
        x = self.inputs
        best = [o for o, ok in zip(x.overlaps, self.eligible, strict=True) if ok]
        return max(best) if best else self.deepest

    def believed_tokens(self, blocks: int) -> int:
        """Prompt tokens ``blocks`` leading blocks stand for, at most the prompt's."""
        return min(self.prompt_tokens, blocks * self.inputs.block_tokens)

    @property
    def not_deepest(self) -> str | None:
        """Why the pick holds less of the prompt than the deepest holder (None: it does not)."""
        x, engine = self.inputs, self.engine
        if engine is None:
            return None
        deep = self.deepest
        if self.overlap_of(engine) >= deep:
            return None
        holders = [i for i, o in enumerate(x.overlaps) if o == deep and self.eligible[i]]
        if not holders:
            return "cap"
        if self.reason in _UNSCORED_PICKS:
            return "policy"
        if x.credit >= deep:
            return "spread"
        if x.session_engine == engine:
            return "session"
        if x.waiting and all(x.waiting[i] > 0 for i in holders):
            return "flow_control"
        return "load"

    @property
    def divergence_block(self) -> int | None:
        """The request's first block nobody holds (None: the whole prompt is held)."""
        deep = self.deepest
        return deep if deep < len(self.keys) else None

    def divergence(self) -> dict[str, Any] | None:
        """Where the request's prefix leaves the deepest holder's: its first block nobody
        holds, the block's first character in the routing text, and who holds the blocks
        before it (None: the whole prompt is held)."""
        deep = self.divergence_block
        if deep is None:
            return None
        x = self.inputs
        holders = [e for e, o in zip(x.candidates, x.overlaps, strict=True) if deep and o == deep]
        return {"block": deep, "char_offset": deep * self.block_chars, "holders": holders}

    def prefix_broken(self) -> dict[str, int] | None:
        """``broken_at`` as its block and that block's first character (None: not broken)."""
        b = self.broken_at
        return None if b is None else {"block": b, "char_offset": b * self.block_chars}

    def explain(self) -> dict[str, Any]:
        """A JSON-ready account of the decision, per candidate."""
        x = self.inputs
        return {
            "engine": self.engine,
            "reason": self.reason,
            "blocks": len(self.keys),
            "prompt_tokens": self.prompt_tokens,
            "spread_blocks": self.inputs.credit,
            "reachable_blocks": self.reachable,
            "not_deepest": self.not_deepest,
            "divergence": self.divergence(),
            "prefix_broken_at": self.prefix_broken(),
            "fallbacks": list(self.fallbacks),
            "candidates": [
                {
                    "engine": e,
                    "overlap_blocks": x.overlaps[i],
                    "predicted_blocks": self.predicted[i],
                    "overlap_source": self.source_of(i),
                    "inflight_requests": x.requests[i],
                    "inflight_tokens": x.tokens[i],
                    "wait_slots": x.waiting[i] if x.waiting else 0,
                    "eligible": self.eligible[i],
                    "scores": {name: round(v[i], 6) for name, v in self.scores.items()},
                    "total": round(self.totals[i], 6),
                }
                for i, e in enumerate(x.candidates)
            ],
        }
