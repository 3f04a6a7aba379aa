"""The routing decision: the one function the gateway and the simulator both call.

``Router.route`` takes a request body and the engines that may serve it, and returns a
``Decision``: the pick, the fallbacks in order, and everything needed to explain it. On the way
it records the request's blocks for the chosen engine (the router's belief until the engine
says otherwise) and takes the request's load, which the caller gives back with ``finish``.

Order of a decision, as in DESIGN.md:
1. block keys of the canonical routing text;
2. per candidate: leading blocks held (index), fleet-wide in-flight requests and tokens;
3. the bounded-load filter marks candidates over the cap ineligible;
4. the picker: round-robin, the ring home, or the best weighted score; with
   ``cold_prefix: ring``, a prefix nobody holds goes to its ring home so that every replica
   agrees on it before gossip spreads the news.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.core.blocks import RoutingText, block_keys, namespace_seed, routing_text
from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.load import LoadBook
from router.core.policy import Policy
from router.core.ring import BoundedLoadRing, load_cap
from router.core.scoring import SCORERS, Inputs


@dataclass(frozen=True, slots=True)
class EngineView:
    """One candidate as the decision saw it."""

    engine: str
    overlap_blocks: int
    inflight_requests: int
    inflight_tokens: int
    eligible: bool
    scores: Mapping[str, float]
    total: float


@dataclass(slots=True)
class Decision:
    """Where a request goes and why; ``engine`` is None when no candidate could take it."""

    engine: str | None
    reason: str
    keys: list[int]
    prompt_tokens: int
    inputs: Inputs
    eligible: list[bool]
    scores: dict[str, list[float]]
    totals: list[float]
    tried: list[str] = field(default_factory=list)
    delta: Delta | None = None
    # In-flight tokens taken on ``engine``: the prompt tokens it was not believed to hold.
    charged_tokens: int = 0
    # True while ``engine`` holds this request's load; ``finish`` clears it exactly once.
    holds_load: bool = False

    @property
    def overlap_blocks(self) -> int:
        """Leading blocks the chosen engine held when the decision was made."""
        if self.engine is None:
            return 0
        i = self.inputs.candidates.index(self.engine)
        return self.inputs.overlaps[i]

    @property
    def overlap_ratio(self) -> float:
        return self.overlap_blocks / len(self.keys) if self.keys else 0.0

    def fallbacks(self) -> list[str]:
        """Candidates not yet tried, best first: eligible before ineligible, then by score."""
        x = self.inputs
        order = sorted(
            range(len(x.candidates)),
            key=lambda i: (not self.eligible[i], -self.totals[i], x.requests[i]),
        )
        tried = set(self.tried)
        return [x.candidates[i] for i in order if x.candidates[i] not in tried]

    def explain(self) -> dict[str, Any]:
        """A JSON-ready account of the decision, per candidate."""
        x = self.inputs
        views = [
            EngineView(
                engine=e,
                overlap_blocks=x.overlaps[i],
                inflight_requests=x.requests[i],
                inflight_tokens=x.tokens[i],
                eligible=self.eligible[i],
                scores={name: round(v[i], 6) for name, v in self.scores.items()},
                total=round(self.totals[i], 6),
            )
            for i, e in enumerate(x.candidates)
        ]
        return {
            "engine": self.engine,
            "reason": self.reason,
            "blocks": len(self.keys),
            "prompt_tokens": self.prompt_tokens,
            "candidates": [
                {
                    "engine": v.engine,
                    "overlap_blocks": v.overlap_blocks,
                    "inflight_requests": v.inflight_requests,
                    "inflight_tokens": v.inflight_tokens,
                    "eligible": v.eligible,
                    "scores": dict(v.scores),
                    "total": v.total,
                }
                for v in views
            ],
        }


class Router:
    """The routing core's state (index, loads, ring, policy) behind one decision function."""

    def __init__(self, policy: Policy, origin: str = "local") -> None:
        self.policy = policy
        self.origin = origin
        self.index = BlockIndex(self._limits(policy), origin)
        self.loads = LoadBook()
        self.ring = BoundedLoadRing()
        self._rr = 0
        self._sessions: dict[str, str] = {}

    @staticmethod
    def _limits(policy: Policy) -> IndexLimits:
        return IndexLimits(
            engine_capacity_blocks=policy.engine_capacity_blocks,
            ttl_seconds=policy.index.ttl_seconds,
            max_entries=policy.index.max_entries,
        )

    # -- fleet and policy changes ------------------------------------------------------------

    def set_engines(self, weights: Mapping[str, int]) -> None:
        """The engines that exist (healthy or not), with their ring weights."""
        self.ring.set_engines(weights)
        for e in weights:
            self.index.add_engine(e)
        for e in set(self.index.engines) - set(weights):
            self.index.drop_engine(e)

    def set_policy(self, policy: Policy) -> None:
        """Swap the policy; the index survives unless the block size changed its keys."""
        old = self.policy
        self.policy = policy
        if policy.block_chars != old.block_chars:
            engines = self.index.engines
            # Numbering goes on: peers drop a delta whose (origin, seq) they have seen before.
            self.index = BlockIndex(self._limits(policy), self.origin, seq=self.index.seq)
            for e in engines:
                self.index.add_engine(e)
        elif self._limits(policy) != self.index.limits:
            self.index.limits = self._limits(policy)
            for e in self.index.engines:
                self.index.add_engine(e)

    # -- the decision ------------------------------------------------------------------------

    def keys_of(self, body: Mapping[str, Any] | RoutingText) -> tuple[RoutingText, list[int]]:
        """Canonical routing text and block keys; raises ``RequestShapeError`` on a bad body."""
        rt = body if isinstance(body, RoutingText) else routing_text(body)
        return rt, block_keys(rt, self.policy.block_chars)

    def route(
        self,
        body: Mapping[str, Any] | RoutingText,
        candidates: Sequence[str],
        now: float,
        session: str | None = None,
        prompt_tokens: int | None = None,
    ) -> Decision:
        """Pick an engine among ``candidates`` for ``body``; take its load and record blocks."""
        rt, keys = self.keys_of(body)
        tokens = rt.approx_tokens if prompt_tokens is None else prompt_tokens
        d = self.decide(keys, tokens, candidates, now, session, namespace_seed(rt.namespace))
        if d.engine is not None:
            self._commit(d, d.engine, now, session)
        return d

    def retry(self, d: Decision, now: float) -> str | None:
        """Move a failed attempt to the next-best candidate; None when none is left."""
        self._release(d)
        if d.engine is not None:
            d.tried.append(d.engine)
        nxt = next(iter(d.fallbacks()), None)
        d.engine = nxt
        if nxt is None:
            d.reason = "no-candidates-left"
            return None
        d.reason = "retry"
        self._commit(d, nxt, now, None)
        return nxt

    def finish(self, d: Decision) -> None:
        """Give back the load a routed request took (on every exit path, exactly once)."""
        self._release(d)

    def _release(self, d: Decision) -> None:
        if d.holds_load and d.engine is not None:
            self.loads.release(d.engine, d.charged_tokens)
            d.holds_load = False

    def _commit(self, d: Decision, engine: str, now: float, session: str | None) -> None:
        d.charged_tokens = d.inputs.uncached(d.inputs.candidates.index(engine))
        self.loads.acquire(engine, d.charged_tokens)
        d.holds_load = True
        if d.keys:
            d.delta = self.index.record(engine, d.keys, now)
        if session is not None:
            self._remember_session(session, engine)

    def _remember_session(self, session: str, engine: str) -> None:
        s = self.policy.scorer("session-affinity")
        limit = s.max_sessions if s is not None else 0
        if not limit:
            return
        sessions = self._sessions
        sessions.pop(session, None)
        sessions[session] = engine
        if len(sessions) > limit:
            del sessions[next(iter(sessions))]

    def decide(
        self,
        keys: list[int],
        prompt_tokens: int,
        candidates: Sequence[str],
        now: float,
        session: str | None = None,
        seed: int = 0,
    ) -> Decision:
        """The pure decision over the current state; changes nothing but round-robin's turn."""
        p = self.policy
        cands = list(dict.fromkeys(candidates))
        x = Inputs(
            candidates=cands,
            blocks=len(keys),
            overlaps=self.index.overlaps(keys, cands, now),
            requests=self.loads.requests(cands),
            tokens=self.loads.tokens(cands),
            session_engine=self._sessions.get(session) if session is not None else None,
            prompt_tokens=prompt_tokens,
            block_tokens=p.block_tokens,
        )
        eligible = self._eligible(x, prompt_tokens)
        scores = {s.type: SCORERS[s.type](s, x) for s in p.scorers}
        totals = [0.0] * len(cands)
        for s in p.scorers:
            w = s.weight
            if w:
                totals = [t + w * v for t, v in zip(totals, scores[s.type], strict=True)]
        d = Decision(None, "no-candidates", keys, prompt_tokens, x, eligible, scores, totals)
        if not cands:
            return d
        # The ring key is the first block nobody holds: for a cold prefix its first block, for a
        # shared system prompt the block where this conversation parts from the others (so new
        # conversations behind one popular prompt spread instead of meeting on one home).
        ring_key = keys[min(max(x.overlaps, default=0), len(keys) - 1)] if keys else seed
        if p.picker == "round-robin":
            self._rr += 1
            d.engine, d.reason = cands[self._rr % len(cands)], "round-robin"
        elif p.picker == "ring" or (p.cold_prefix == "ring" and not any(x.overlaps)):
            ok = {e for e, fine in zip(cands, eligible, strict=True) if fine}
            d.engine = self.ring.home(ring_key, ok.__contains__)
            d.reason = "ring" if p.picker == "ring" else "cold-prefix-ring"
            if d.engine is None:  # engines that are candidates but not (yet) on the ring
                d.engine = self._best(x, eligible, totals, ring_key)
        else:
            d.engine, d.reason = self._best(x, eligible, totals, ring_key), "best-score"
        return d

    def _eligible(self, x: Inputs, prompt_tokens: int) -> list[bool]:
        b = self.policy.bounded_load
        if b is None:
            return [True] * len(x.candidates)
        if b.metric == "requests":
            loads, weight = x.requests, 1
        else:
            loads, weight = x.tokens, max(1, prompt_tokens)
        # The least loaded engine always stays admissible: with token loads one request can
        # outweigh the whole margin, and a cap that admits nobody would route nowhere.
        cap = max(load_cap(sum(loads), len(loads), b.epsilon, weight), min(loads) + weight)
        return [v + weight <= cap for v in loads]

    def _best(self, x: Inputs, eligible: list[bool], totals: list[float], seed: int) -> str:
        if all(eligible):
            top = max(totals)
            tied = [i for i, t in enumerate(totals) if t >= top - 1e-12]
        else:
            idx = [i for i, ok in enumerate(eligible) if ok] or list(range(len(totals)))
            top = max([totals[i] for i in idx])
            tied = [i for i in idx if totals[i] >= top - 1e-12]
        if len(tied) == 1:
            return x.candidates[tied[0]]
        # Equal scores: the first of them on the ring from the request's key, so every replica
        # breaks the tie the same way and a new prefix lands on its consistent-hash home.
        names = {x.candidates[i] for i in tied}
        home = self.ring.home(seed, names.__contains__)
        return home if home is not None else min(names)
