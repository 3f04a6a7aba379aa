"""What every scorer shares: the ``Inputs`` of one decision, the shape of a scorer type, and
the reading of its params from a policy file.

A scorer type is one module holding its kebab-case ``NAME``, a frozen ``Params`` dataclass
whose fields carry their defaults and limits (``param``), ``parse(fields)`` and
``score(params, inputs)``; ``router.core.scorers.registry`` lists them. A scorer that
remembers something between requests (session-affinity) also gives a ``Memory`` factory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from router.core import hotpath
from router.core.fields import Fields

LoadMetric = Literal["requests", "tokens"]
LOAD_METRICS: tuple[LoadMetric, ...] = ("requests", "tokens")

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a decision sees: candidates and, per candidate in the same order, its figures."""

    candidates: Sequence[str]
    blocks: int  # full blocks in the request
    overlaps: Sequence[int]  # leading blocks each candidate holds
    requests: Sequence[int]  # fleet-wide in-flight requests
    tokens: Sequence[int]  # fleet-wide prompt tokens sent and not yet prefilled
    session_engine: str | None  # where this request's session went last, if known
    prompt_tokens: int = 0
    block_tokens: int = 1
    # Engine-reported, blended into ``requests`` already; empty or 0 where nothing is known.
    # Batch slots a request sent now would wait for inside the engine (``LoadBook.signals``):
    # its queue, and what the routers sent since its report into a batch known to be full.
    waiting: Sequence[int] = ()
    kv_usage: Sequence[float] = ()  # share of its KV cache in use, from 0 to 1
    # Leading blocks of a hot prefix every candidate is scored as holding (``HotPrefix``), or
    # only those ``credited`` (empty: every one) where a copy would evict nothing of value.
    credit: int = 0
    credited: Sequence[bool] = ()
    # Router tokens per engine token (``core.token_scale``; 1 until learnt): params counted in
    # the engines' tokens are read times this, the unit the prompt and the queues are in.
    token_scale: float = 1.0

    def uncached(self, i: int) -> int:
        """Prompt tokens candidate ``i`` would have to prefill (the part it does not hold)."""
        return max(0, self.prompt_tokens - self.overlaps[i] * self.block_tokens)

    @property
    def scored_overlaps(self) -> Sequence[int]:
        """The overlaps scorers weigh: what each candidate holds, or the hot prefix's credit."""
        c = self.credit
        if not c:
            return self.overlaps
        if self.credited:
            pairs = zip(self.overlaps, self.credited, strict=True)
            return [max(o, c) if m else o for o, m in pairs]
        return [max(o, c) for o in self.overlaps]


def falling(costs: Sequence[float]) -> list[float]:
    """Per candidate, 1 - its cost / the dearest's: 1 costs nothing, 0 costs the most (all 1
    when nothing costs anything). The scorers that price candidates share this scale."""
    native = hotpath.native
    if native is not None:
        try:
            return native.falling(costs)
        except (OverflowError, TypeError):  # ints past 2**53: the reference divides them exactly
            pass
    top = max(costs, default=0)
    if top <= 0:
        return [1.0] * len(costs)
    return [1.0 - c / top for c in costs]


def weigh(weights: Sequence[float], columns: Sequence[list[float]], n: int) -> list[float]:
    """Per candidate (``n`` of them), the sum over the scorers of weight x score, in the
    scorers' order (a weight of 0 skipped): what the picker compares."""
    native = hotpath.native
    if native is not None:
        try:
            return native.weighted(weights, columns, n)
        except (OverflowError, TypeError):  # scores that are not floats: Python's arithmetic
            pass
    totals = [0.0] * n
    for w, column in zip(weights, columns, strict=True):
        if w:
            totals = [t + w * v for t, v in zip(totals, column, strict=True)]
    return totals


def param(
    default: Any,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] = (),
) -> Any:
    """A params field with its default and its limits (numbers; for a list of strings, its
    length) or choices (text)."""
    return dataclasses.field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices})


@dataclass(frozen=True, slots=True)
class Limits:
    """One params field as a policy file sees it: its name, default and allowed values."""

    name: str
    default: Any
    lo: float | None
    hi: float | None
    choices: tuple[str, ...]


def limits(params: type[Any]) -> tuple[Limits, ...]:
    """The fields of a ``Params`` dataclass with their defaults and limits, in order."""
    return tuple(
        Limits(
            f.name,
            f.default,
            f.metadata.get("lo"),
            f.metadata.get("hi"),
            f.metadata.get("choices", ()),
        )
        for f in dataclasses.fields(params)
    )


def read_params(params: type[P], f: Fields) -> P:
    """Every field of ``params`` read from ``f`` with its default and limits."""
    values: dict[str, Any] = {}
    for lim in limits(params):
        d, name = lim.default, lim.name
        if isinstance(d, bool):
            values[name] = f.flag(name, d)
        elif isinstance(d, int):
            assert lim.lo is not None and lim.hi is not None
            values[name] = f.integer(name, d, int(lim.lo), int(lim.hi))
        elif isinstance(d, float):
            assert lim.lo is not None and lim.hi is not None
            values[name] = f.number(name, d, lim.lo, lim.hi)
        elif isinstance(d, tuple):  # a list of strings; its limits bound its length
            assert lim.lo is not None and lim.hi is not None
            texts = f.texts(name) if f.has(name) else list(d)
            if not lim.lo <= len(texts) <= lim.hi:
                f.fail(f.at(name), f"must list from {lim.lo:g} to {lim.hi:g} strings")
            values[name] = tuple(texts)
        elif lim.choices:
            values[name] = f.choice(name, d, lim.choices)
        else:
            values[name] = f.text(name, d)
    return params(**values)


class Memory(Protocol):
    """What a scorer remembers between requests: the key a request is known by (from its
    headers and body), and the engine that key's last answered request went to."""

    def key_of(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
        """The key a request is remembered by (None: it names none)."""

    def recall(self, key: str) -> str | None:
        """The engine that answered ``key``'s last request, if remembered."""

    def remember(self, key: str, engine: str) -> None:
        """``key``'s latest request was answered by ``engine``."""

    def update(self, params: Any) -> None:
        """Go on with the params of a reloaded policy."""


@dataclass(frozen=True, slots=True)
class ScorerType(Generic[P]):
    """One registered scorer: its name, params, reader, score and (optional) memory."""

    name: str
    params: type[P]
    parse: Callable[[Fields], P]
    score: Callable[[P, Inputs], list[float]]
    memory: Callable[[P], Memory] | None = None
