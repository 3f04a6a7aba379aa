"""The routing decision and the named state changes around it: one request's life in the core.

The gateway and the simulator both drive a request through ``RoutingCore`` in the same order:

1. ``decide``: a query. Block keys of the canonical routing text; per candidate the leading
   blocks it holds (confirmed, or provisional for attempts in flight), the fleet-wide
   in-flight requests and tokens; the bounded-load filter; for a hot prefix (more of its
   requests in flight per holder than ``hot_prefix.spread_above``), every candidate credited
   with holding it; the picker (round-robin, the ring home, or the best weighted score; with
   ``cold_prefix: ring`` a prefix nobody holds goes to its ring home, so every replica agrees
   on it before gossip spreads the news). It returns a
   frozen ``Decision``: the pick, the ordered fallbacks, and the explanation. Nothing changes.
2. ``acquire(decision, engine, now)``: take the engine's load and put the request's blocks in
   the index *provisionally* for it (``core.predictions``: not gossiped, withdrawn on
   failure); returns a ``Lease``.
3. ``record(lease, now)``: the engine's answer has begun (its first byte), so it holds the
   prefix: the entries are confirmed and the ``Delta`` to publish is returned; the prompt is
   prefilled, so its tokens leave the engine's queue.
4. ``release(lease)``: on every exit, exactly once (a second call is a no-op): the load goes
   back, and provisional entries no answer confirmed (a failed attempt) are withdrawn.

``forget(engine)`` drops everything believed of an engine (it restarted, or was replaced).

Precise engines (``set_precise``: their KV cache events arrive and are complete) are asked in
their own key space when the request's token ids are known (``decide(..., tokenized=...)``):
the router's chained keys over the ids, cut at the engine's block size, against the entries
the engine's events put in the index (``observe``), weighted by medium. The event overlap is
scaled to the request's text blocks (the share of the prompt held), so scorers compare every
engine in one unit. Entries this router routed there in the last ``bridge_seconds`` bridge the
time until the engine's event arrives; the larger of the two counts, and each candidate's
explanation says which source it came from (``event``, ``predicted``, ``approximate`` or
``none``). Engines without events, a degraded feed, or a request whose tokens are unknown use
the text keys.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.core.blocks import RoutingText, block_keys, namespace_seed, routing_text
from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.kv_events import Change, token_keys
from router.core.load import LoadBook
from router.core.policy import Policy
from router.core.predictions import Predictions
from router.core.ring import BoundedLoadRing, load_cap
from router.core.scoring import SCORERS, Inputs
from router.core.shortlist import shortlist

# Above this many candidates only a shortlist is scored (``core.shortlist``). Measured
# (bench/RESULTS.md): an 8K-token decision at 256 engines costs about a third of scoring
# every engine.
SHORTLIST_ABOVE = 12


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

    def explain(self) -> dict[str, Any]:
        """A JSON-ready account of the decision, per candidate."""
        x = self.inputs
        return {
            "engine": self.engine,
            "reason": self.reason,
            "blocks": len(self.keys),
            "prompt_tokens": self.prompt_tokens,
            "spread_blocks": self.inputs.credit,
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


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A request's token ids as the engines' tokenizer gives them, and its LoRA adapter.

    ``text_chars``: the length of routing text the ids stand for (characters; for a prompt of
    ids, ids times ``CHARS_PER_TOKEN``), to turn tokens an engine holds into the request's
    text blocks. When the ids are only a head of the prompt (an earlier turn of the
    conversation, tokenized before), it is that head's length. None: the ids are the whole
    prompt, and its text blocks are spread evenly over them.
    """

    token_ids: Sequence[int]
    lora_name: str | None = None
    text_chars: int | None = None


# Medium tiers: a block in CPU memory or on disk still saves prefill, but costs a load.
DEFAULT_MEDIUM_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.5, "disk": 0.25}
# How long a routed prefix counts on a precise engine before its own event must confirm it:
# events arrive within milliseconds; a prefix still unconfirmed after this was not cached.
DEFAULT_BRIDGE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Lease:
    """One attempt's hold on an engine: the load it took and the blocks it claimed."""

    id: int
    engine: str
    # Prompt tokens charged until the first byte (``record``): the part the engine was not
    # believed to hold, which it has to prefill.
    tokens: int
    keys: tuple[int, ...]
    # Of ``keys``, those this attempt claims (``core.predictions``): the ones the engine was
    # not believed to hold, and the provisional ones it relies on.
    claimed: tuple[int, ...]
    session: str | None
    sent_at: float = 0.0  # when the load was taken, to place it against engines' reports
    prefix: int | None = None  # ``Decision.prefix``: this attempt adds to its heat


class RoutingCore:
    """The routing core's state (index, loads, predictions, ring, policy) and its operations."""

    def __init__(self, policy: Policy, origin: str = "local") -> None:
        self.policy = policy
        self.origin = origin
        self.index = BlockIndex(self._limits(policy), origin)
        self.loads = LoadBook()
        self.predictions = Predictions()
        self.ring = BoundedLoadRing()
        self._turn = 0  # round-robin's position, advanced by ``acquire``
        self._sessions: dict[str, str] = {}
        # Outstanding leases -> whether their claims are still unconfirmed.
        self._leases: dict[int, bool] = {}
        self._lease_ids = itertools.count(1)
        # Engines whose events are complete -> their block size in tokens.
        self.precise: dict[str, int] = {}
        self.medium_weights: Mapping[str, float] = DEFAULT_MEDIUM_WEIGHTS
        self.bridge_seconds = DEFAULT_BRIDGE_SECONDS

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
            # Claims on the old keys: the old index is gone; leases still out withdraw claims
            # that are no longer there, which ``Predictions.withdraw`` ignores.
            self.predictions.clear()
        elif self._limits(policy) != self.index.limits:
            self.index.limits = self._limits(policy)
            for e in self.index.engines:
                self.index.add_engine(e)

    def set_precise(self, engine: str, block_size: int | None) -> None:
        """``engine``'s events are complete, with blocks of ``block_size`` (None: they are not)."""
        if block_size is None:
            self.precise.pop(engine, None)
        else:
            self.precise[engine] = block_size

    def observe(self, engine: str, change: Change, now: float) -> None:
        """Apply what ``engine``'s own KV cache event says (``core.kv_events``)."""
        if change.cleared:
            self.index.clear_events(engine)
        if change.removed:
            self.index.evict(engine, change.removed, change.medium)
        if change.stored:
            self.index.store(engine, change.stored, change.medium, now)

    def _weight(self, medium: str) -> float:
        w = self.medium_weights
        return w.get(medium, min(w.values(), default=0.0))

    # -- the query ---------------------------------------------------------------------------

    def keys_of(self, body: Mapping[str, Any] | RoutingText) -> tuple[RoutingText, list[int]]:
        """Canonical routing text and block keys; raises ``RequestShapeError`` on a bad body."""
        rt = body if isinstance(body, RoutingText) else routing_text(body)
        return rt, block_keys(rt, self.policy.block_chars)

    def decide(
        self,
        body: Mapping[str, Any] | RoutingText,
        candidates: Sequence[str],
        now: float,
        session: str | None = None,
        prompt_tokens: int | None = None,
        *,
        tokenized: TokenPrompt | None = None,
    ) -> Decision:
        """Where ``body`` should go among ``candidates`` (distinct engines), and why.

        Changes nothing.
        """
        rt, keys = self.keys_of(body)
        tokens = rt.approx_tokens if prompt_tokens is None else prompt_tokens
        seed = namespace_seed(rt.namespace)
        return self.decide_keys(keys, tokens, candidates, now, session, seed, tokenized=tokenized)

    def decide_keys(
        self,
        keys: Sequence[int],
        prompt_tokens: int,
        candidates: Sequence[str],
        now: float,
        session: str | None = None,
        seed: int = 0,
        *,
        tokenized: TokenPrompt | None = None,
    ) -> Decision:
        """``decide`` for keys already computed (``seed`` names the ring home of no blocks)."""
        p = self.policy
        cands = list(candidates)
        overlaps = self.index.overlaps(keys, cands, now)
        src: dict[str, str] = {}  # overlaps from events or the bridge; the rest approximate
        if tokenized is not None and self.precise:
            self._precise_overlaps(keys, tokenized, cands, now, overlaps, src)
        requests = self.loads.requests(cands, now)
        eligible = self._eligible(cands, requests, prompt_tokens)
        deep = max(overlaps, default=0)
        prefix = keys[deep - 1] if deep else None
        # The ring key is the first block nobody holds: for a cold prefix its first block, for a
        # shared system prompt the block where this conversation parts from the others (so new
        # conversations behind one popular prompt spread instead of meeting on one home).
        ring_key = keys[min(deep, len(keys) - 1)] if keys else seed
        spread = p.hot_prefix.spread_above
        heat = self.loads.heat(prefix) if prefix is not None else 0
        # Hot: its holders are busy with it, so any engine may take a copy.
        credit = deep if spread and heat > spread * overlaps.count(deep) else 0
        session_engine = self._sessions.get(session) if session is not None else None
        unscored: list[str] = []
        if p.picker == "max-score" and len(cands) > SHORTLIST_ABOVE:
            keep = shortlist(
                cands, overlaps, requests, eligible, session_engine, ring_key, self.ring.home
            )
            if len(keep) < len(cands):
                kept = {cands[i] for i in keep}
                unscored = list(itertools.filterfalse(kept.__contains__, cands))
                cands = [cands[i] for i in keep]
                overlaps = [overlaps[i] for i in keep]
                requests = [requests[i] for i in keep]
                eligible = [eligible[i] for i in keep]
        tokens = self.loads.tokens(cands)
        predicted = [0] * len(cands)
        if self.predictions:
            for i, e in enumerate(cands):
                if overlaps[i]:
                    predicted[i] = self.predictions.count(e, keys[: overlaps[i]])
        waiting, usage = self.loads.signals(cands, now)
        x = Inputs(
            candidates=cands,
            blocks=len(keys),
            overlaps=overlaps,
            requests=requests,
            tokens=tokens,
            session_engine=session_engine,
            prompt_tokens=prompt_tokens,
            block_tokens=p.block_tokens,
            waiting=waiting,
            kv_usage=usage,
            credit=credit,
        )
        scores = {s.type: SCORERS[s.type](s, x) for s in p.scorers}
        totals = [0.0] * len(cands)
        for s in p.scorers:
            w = s.weight
            if w:
                totals = [t + w * v for t, v in zip(totals, scores[s.type], strict=True)]
        engine, reason = self._pick(x, eligible, totals, ring_key)
        order = sorted(
            range(len(cands)), key=lambda i: (not eligible[i], -totals[i], x.requests[i])
        )
        pairs = zip(cands, overlaps, strict=True) if src else ()  # (): see ``source_of``
        return Decision(
            engine=engine,
            reason=reason,
            keys=tuple(keys),
            prompt_tokens=prompt_tokens,
            inputs=x,
            predicted=tuple(predicted),
            eligible=tuple(eligible),
            scores={k: tuple(v) for k, v in scores.items()},
            totals=tuple(totals),
            fallbacks=(*(cands[i] for i in order if cands[i] != engine), *unscored),
            session=session,
            sources=tuple(src.get(e) or ("approximate" if o else "none") for e, o in pairs),
            prefix=prefix,
        )

    def _precise_overlaps(
        self,
        keys: Sequence[int],
        tokenized: TokenPrompt,
        cands: Sequence[str],
        now: float,
        overlaps: list[int],
        src: dict[str, str],
    ) -> None:
        """Replace each precise candidate's overlap with its events' (or the bridge's)."""
        by_size: dict[int, list[int]] = {}
        for i, e in enumerate(cands):
            size = self.precise.get(e)
            if size is None:
                continue
            pk = by_size.get(size)
            if pk is None:
                pk = by_size[size] = token_keys(tokenized.token_ids, size, tokenized.lora_name)
            _, weighted = self.index.event_overlap(e, pk, self._weight)
            held = self._text_blocks(weighted * size, tokenized, len(keys))
            bridge = 0
            if overlaps[i]:
                bridge = self.index.leading_since(e, keys, now - self.bridge_seconds)
            if bridge > held:
                overlaps[i], src[e] = bridge, "predicted"
            else:
                overlaps[i], src[e] = held, "event" if held else "none"

    def _text_blocks(self, tokens: float, tokenized: TokenPrompt, blocks: int) -> int:
        """Held ``tokens`` of the prompt as its leading text blocks (what scorers count)."""
        ids = len(tokenized.token_ids)
        if not ids:
            return 0
        chars = tokenized.text_chars
        if chars is None:
            return min(blocks, int(tokens * blocks / ids + 1e-9))
        # Through characters: the ids cover ``chars`` of text, whole blocks or not, so a held
        # head of whole blocks is never cut short by the text's partial last block.
        return min(blocks, int(tokens * chars / ids / self.policy.block_chars + 1e-9))

    def _pick(
        self, x: Inputs, eligible: list[bool], totals: list[float], ring_key: int
    ) -> tuple[str | None, str]:
        p = self.policy
        cands = x.candidates
        if not cands:
            return None, "no-candidates"
        if p.picker == "round-robin":
            return cands[(self._turn + 1) % len(cands)], "round-robin"
        if p.picker == "ring" or (p.cold_prefix == "ring" and not any(x.overlaps)):
            ok = {e for e, fine in zip(cands, eligible, strict=True) if fine}
            home = self.ring.home(ring_key, ok.__contains__)
            reason = "ring" if p.picker == "ring" else "cold-prefix-ring"
            if home is None:  # engines that are candidates but not (yet) on the ring
                home = self._best(x, eligible, totals, ring_key)
            return home, reason
        return self._best(x, eligible, totals, ring_key), "best-score"

    def _eligible(
        self, cands: Sequence[str], requests: Sequence[int], prompt_tokens: int
    ) -> list[bool]:
        b = self.policy.bounded_load
        if b is None:
            return [True] * len(requests)
        if b.metric == "requests":
            loads, weight = requests, 1
        else:
            loads, weight = self.loads.tokens(cands), max(1, prompt_tokens)
        if not loads:
            return []
        # The least loaded engine always stays admissible: with token loads one request can
        # outweigh the whole margin, and a cap that admits nobody would route nowhere.
        floor = max(min(loads) + weight, b.min_cap * weight)
        cap = max(load_cap(sum(loads), len(loads), b.epsilon, weight), floor)
        # v + weight <= cap for every (integer) load v, as one pass in C.
        return list(map((math.floor(cap) - weight).__ge__, loads))

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

    # -- the state changes -------------------------------------------------------------------

    def acquire(self, d: Decision, engine: str, now: float) -> Lease:
        """Take ``engine``'s load for an attempt of ``d`` and claim its blocks there."""
        x = d.inputs
        tokens = x.uncached(x.candidates.index(engine)) if engine in x.candidates else 0
        held = self.index.overlap(engine, d.keys, now)
        # It claims the blocks it adds and the provisional ones it relies on, so that a
        # sibling attempt's failure cannot take blocks from under it (or leave a hole in its
        # chain, which the index's search for held blocks assumes away).
        relied = self.predictions.claimed(engine, d.keys[:held])
        claimed = (*relied, *d.keys[held:])
        lease = Lease(
            next(self._lease_ids), engine, tokens, d.keys, claimed, d.session, now, d.prefix
        )
        self.loads.acquire(engine, tokens, now, d.prefix)
        if d.keys:
            self.index.predict(engine, d.keys, now)
            self.predictions.claim(engine, claimed)
        self._leases[lease.id] = True
        if d.reason == "round-robin" and engine == d.engine:
            self._turn += 1
        return lease

    def record(self, lease: Lease, now: float) -> Delta | None:
        """The engine answered (first byte): it holds the prefix. The delta to publish, if any."""
        if not self._leases.get(lease.id):
            return None  # released already, or recorded before
        self._leases[lease.id] = False
        # Its prefill is done: what is queued on the engine no longer includes its prompt.
        self.loads.prefilled(lease.engine, lease.tokens)
        if lease.session is not None:
            self._remember_session(lease.session, lease.engine)
        if not lease.keys:
            return None
        self.predictions.confirm(lease.engine, lease.keys)
        return self.index.confirm(lease.engine, lease.keys, now)

    def release(self, lease: Lease) -> None:
        """End an attempt: give its load back and withdraw claims no answer confirmed."""
        unconfirmed = self._leases.pop(lease.id, None)
        if unconfirmed is None:
            return
        tokens = lease.tokens if unconfirmed else 0
        self.loads.release(lease.engine, tokens, lease.sent_at, lease.prefix)
        if unconfirmed and lease.claimed:
            gone = self.predictions.withdraw(lease.engine, lease.claimed)
            self.index.withdraw(lease.engine, gone)

    def forget(self, engine: str) -> Delta:
        """Believe ``engine`` holds nothing (it restarted or was replaced); the delta to publish."""
        return self.index.clear(engine)

    @property
    def outstanding(self) -> int:
        """Leases acquired and not yet released (0 whenever the gateway is idle)."""
        return len(self._leases)

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
