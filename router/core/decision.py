"""The routing decision and the named state changes around it: one request's life in the core.

The gateway and the simulator both drive a request through ``RoutingCore`` in the same order:

1. ``decide``: a query. Block keys of the canonical routing text; per candidate the leading
   blocks it holds (confirmed, or provisional for attempts in flight), the fleet-wide
   in-flight requests and tokens; the bounded-load filter; for a hot prefix (more of its
   requests in flight per holder than ``hot_prefix.spread_above``), every candidate credited
   with holding it where a copy would evict nothing still in use
   (``hot_prefix.keep_younger_than_seconds``); the picker (round-robin, the ring home, or the
   best weighted score; with ``cold_prefix: ring`` a prefix nobody holds goes to its ring
   home, so every replica agrees on it before gossip spreads the news). It returns a
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

A request's session key (``session_of``) is the policy's session-affinity scorer's, or, in a
policy without one, that scorer's default (the ``x-session-id`` header, else the body's
``user``): ``record``
remembers each session's answered turn (``core.turns``), so that ``decide`` can say where a
follow-up turn's prefix broke from the previous one (``Decision.broken_at``).

Precise engines (``set_precise``: their KV cache events are complete) are asked in their own
key space when the request's token ids are known (``decide(..., tokenized=...)``, see
``core.precise``). Which scorers and which picker run is the policy's (``core.scorers``,
``core.pickers``); a scorer that remembers (session-affinity) names the request's key
(``session_of``) and is told where its answer came from (``record``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.core.blocks import RoutingText, block_keys, namespace_seed, routing_text
from router.core.engine_blocks import Change
from router.core.engine_sizes import EngineSizes
from router.core.index import BlockIndex, Delta, IndexLimits
from router.core.load import DEFAULT_STALE_AFTER_SECONDS, LoadBook
from router.core.pickers import PICKERS, ROUND_ROBIN, Choice, ranked
from router.core.policy import Policy
from router.core.precise import PreciseSettings, TokenPrompt, precise_overlaps
from router.core.predictions import Predictions
from router.core.ring import BoundedLoadRing, under_cap
from router.core.scorers.base import Inputs, Memory, weigh
from router.core.scorers.registry import SCORERS
from router.core.scorers.session_affinity import Params as SessionParams
from router.core.scorers.session_affinity import session_of
from router.core.shortlist import narrow, shortlist
from router.core.turns import Turns
from router.core.verdict import Decision

# Above this many candidates only a shortlist is scored (``core.shortlist``). Measured
# (bench/RESULTS.md): an 8K-token decision at 256 engines costs about a third of scoring
# every engine.
SHORTLIST_ABOVE = 12
# How a request names its session when the policy's scorers do not say.
_DEFAULT_SESSION = SessionParams()


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """The deployment's settings that steer decisions, besides the policy.

    ``precise``: how KV-event overlaps are weighed; ``stale_after``: seconds after which an
    engine's own load report no longer counts (``core.load``).
    """

    precise: PreciseSettings = field(default_factory=PreciseSettings)
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS


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

    def __init__(
        self, policy: Policy, origin: str = "local", settings: CoreSettings | None = None
    ) -> None:
        self.settings = settings = settings or CoreSettings()
        self.policy = policy
        self.origin = origin
        self.index = BlockIndex(self._limits(policy), origin)
        self.loads = LoadBook(settings.stale_after)
        self.predictions = Predictions()
        self.ring = BoundedLoadRing()
        self._turn = 0  # round-robin's position, advanced by ``acquire``
        self.sizes = EngineSizes()  # what engines say they cache, kept across policies
        self._memories = self._remembering(policy, {})
        # Outstanding leases -> whether their claims are still unconfirmed.
        self._leases: dict[int, bool] = {}
        self._lease_ids = itertools.count(1)
        # Engines whose events are complete -> their block size in tokens.
        self.precise: dict[str, int] = {}
        self.turns = Turns()

    @staticmethod
    def _limits(policy: Policy) -> IndexLimits:
        return IndexLimits(
            engine_capacity_blocks=policy.engine_capacity_blocks,
            ttl_seconds=policy.index.ttl_seconds,
            max_entries=policy.index.max_entries,
        )

    @staticmethod
    def _remembering(policy: Policy, old: Mapping[str, Memory]) -> dict[str, Memory]:
        """The memory of every policy scorer that keeps one; a reload keeps what is known."""
        out: dict[str, Memory] = {}
        for s in policy.scorers:
            make = SCORERS[s.type].memory
            if make is None:
                continue
            memory = old.get(s.type)
            if memory is None:
                memory = make(s.params)
            else:
                memory.update(s.params)
            out[s.type] = memory
        return out

    # -- fleet and policy changes ------------------------------------------------------------

    def set_engines(self, weights: Mapping[str, int]) -> None:
        """The engines that exist (healthy or not), with their ring weights."""
        self.ring.set_engines(weights)
        for e in weights:
            self.index.add_engine(e)
        for e in set(self.index.engines) - set(weights):
            self.index.drop_engine(e)
            self.sizes.forget(e)

    def set_policy(self, policy: Policy) -> None:
        """Swap the policy; the index survives unless the block size changed its keys."""
        old = self.policy
        self.policy = policy
        self._memories = self._remembering(policy, self._memories)
        if policy.block_chars != old.block_chars:
            engines = self.index.engines
            # Numbering goes on: peers drop a delta whose (origin, seq) they have seen before.
            self.index = BlockIndex(self._limits(policy), self.origin, seq=self.index.seq)
            for e in engines:
                self.index.add_engine(e)
            self.sizes.apply(self.index, policy.block_tokens)
            # Claims on the old keys: the old index is gone; leases still out withdraw claims
            # that are no longer there, which ``Predictions.withdraw`` ignores.
            self.predictions.clear()
        elif self._limits(policy) != self.index.limits:
            self.index.limits = self._limits(policy)
            for e in self.index.engines:
                self.index.add_engine(e)

    def engine_capacity(self, engine: str, tokens: int) -> None:
        """``engine`` says it caches ``tokens`` prompt tokens (its own): the index keeps that
        much of it instead of the policy's guess (``core.engine_sizes``)."""
        self.sizes.said(self.index, self.policy.block_tokens, engine, tokens)

    def calibrate(self, router_tokens: int, engine_tokens: int) -> None:
        """An answered prompt as the router counted it and as its engine did."""
        self.sizes.calibrate(self.index, self.policy.block_tokens, router_tokens, engine_tokens)

    def set_precise(self, engine: str, block_size: int | None) -> None:
        """``engine``'s events are complete, with blocks of ``block_size`` (None: they are not)."""
        if block_size is None:
            self.precise.pop(engine, None)
        else:
            self.precise[engine] = block_size

    def observe(self, engine: str, change: Change, now: float) -> None:
        """Apply what ``engine``'s own KV cache event says (``core.engine_blocks``)."""
        if change.cleared:
            self.index.clear_events(engine)
        if change.removed:
            self.index.evict(engine, change.removed, change.medium)
        if change.stored:
            self.index.store(engine, change.stored, change.medium, now)

    # -- the query ---------------------------------------------------------------------------

    def session_of(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
        """The key the policy remembers this request's session by; with no scorer that
        remembers, the default one (None: it names none)."""
        if not self._memories:
            return session_of(_DEFAULT_SESSION, headers, body)
        for memory in self._memories.values():
            key = memory.key_of(headers, body)
            if key is not None:
                return key
        return None

    def _recall(self, session: str | None) -> str | None:
        if session is None:
            return None
        for memory in self._memories.values():
            engine = memory.recall(session)
            if engine is not None:
                return engine
        return None

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
        if prompt_tokens is None and tokenized is not None and rt.text is not None:
            # The engines' own count, not characters / 4: the load inputs and /debug/route.
            tokens = tokenized.prompt_tokens(len(rt.text))
        seed = 0 if keys else namespace_seed(rt.namespace)  # the ring key of no full block
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
            precise_overlaps(
                self.index,
                self.precise,
                self.settings.precise,
                p.block_chars,
                keys,
                tokenized,
                cands,
                now,
                overlaps,
                src,
            )
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
        session_engine = self._recall(session)
        picker = PICKERS[p.picker]
        unscored: list[str] = []
        if picker.scored and len(cands) > SHORTLIST_ABOVE:
            keep = shortlist(
                cands, overlaps, requests, eligible, session_engine, ring_key, self.ring.home
            )
            if len(keep) < len(cands):
                unscored, cands, overlaps, requests, eligible = narrow(
                    keep, cands, overlaps, requests, eligible
                )
        credited: list[bool] = []
        if credit and p.hot_prefix.keep_younger_than_seconds:
            credited = self._copy_affordable(cands, overlaps, credit, now)
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
            credited=credited,
            token_scale=self.sizes.scale.ratio,
        )
        scores = {s.type: SCORERS[s.type].score(s.params, x) for s in p.scorers}
        weights = [s.weight for s in p.scorers]
        totals = weigh(weights, [scores[s.type] for s in p.scorers], len(cands))
        engine, reason = picker.pick(
            Choice(x, eligible, totals, ring_key, self.ring, self._turn, p.cold_prefix == "ring")
        )
        order = ranked(eligible, totals, requests)
        pairs = zip(cands, overlaps, strict=True)
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
            fallbacks=(*[cands[i] for i in order if cands[i] != engine], *unscored),
            session=session,
            # Empty where every overlap is approximate: see ``source_of``.
            sources=tuple(src.get(e) or ("approximate" if o else "none") for e, o in pairs)
            if src
            else (),
            prefix=prefix,
            block_chars=p.block_chars,
            broken_at=self.turns.broken_at(session, keys, deep),
        )

    def _copy_affordable(
        self, cands: Sequence[str], overlaps: Sequence[int], credit: int, now: float
    ) -> list[bool]:
        """Which candidates may take a copy of a hot prefix's ``credit`` blocks: those that
        hold it, and those where the copy would evict only blocks untouched for
        ``keep_younger_than_seconds`` (in a small cache it would push out other prompts
        still in use: the hit ratio pays for the spread there)."""
        keep = self.policy.hot_prefix.keep_younger_than_seconds
        out = []
        for e, o in zip(cands, overlaps, strict=True):
            age = self.index.evicted_age(e, credit - o, now) if o < credit else None
            out.append(age is None or age >= keep)
        return out

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
        return under_cap(loads, weight, b.epsilon, b.min_cap)

    # -- the state changes -------------------------------------------------------------------

    def acquire(self, d: Decision, engine: str, now: float, *, prefills: bool = True) -> Lease:
        """Take ``engine``'s load for an attempt of ``d`` and claim its blocks there;
        ``prefills`` False: its KV cache arrives from a prefill engine (nothing to prefill)."""
        x = d.inputs
        tokens = (
            x.uncached(x.candidates.index(engine)) if prefills and engine in x.candidates else 0
        )
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
        if d.reason == ROUND_ROBIN and engine == d.engine:
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
            for memory in self._memories.values():
                memory.remember(lease.session, lease.engine)
            self.turns.remember(lease.session, lease.keys)
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
