"""A routing policy: the YAML file's model, and its strict loader.

Loading is two-phase, like llm-d's scheduler config: first a strict decode of every field with
its default and limits (unknown keys and wrong types are errors), then cross-checks between
fields. Every error names the file, the field path and the reason, for example
``policies/x.yaml: scorers[1].weight: must be a number from 0.0 to 1000.0, got 'high'``.
Each scorer's own fields are read by its type (``router.core.scorers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

from router.core.blocks import CHARS_PER_TOKEN
from router.core.fields import Fields, parse_yaml
from router.core.pickers import PICKER_TYPES, PICKERS
from router.core.scorers.base import LOAD_METRICS, LoadMetric
from router.core.scorers.registry import SCORER_TYPES, SCORERS

# 512 characters, about 128 tokens. Measured with `kvrouter simulate` (bench/RESULTS.md):
# 128 to 1024 give the same hit ratio on chat and Mooncake workloads, and each halving of the
# block doubles the hashing and recording per request; 512 is the smallest block at which
# an 8K-token prompt decides in about 100 us with 64 engines.
DEFAULT_BLOCK_CHARS = 512

ColdPrefix = Literal["ring", "score"]

COLD_PREFIX: tuple[ColdPrefix, ...] = ("ring", "score")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class BoundedLoad:
    """Consistent hashing with bounded loads: no engine above ceil((1 + epsilon) x mean).

    ``min_cap``: the cap never falls below this many requests (with the tokens metric, this
    many of the request's prompts). At light load the mean is a fraction of a request and
    the cap alone would turn a conversation away from its cache for the one request in
    flight there, though a few requests make no engine a hotspot.
    """

    epsilon: float = 0.25
    metric: LoadMetric = "requests"
    min_cap: int = 0


@dataclass(frozen=True, slots=True)
class Scorer:
    """A weighted scorer: its registered kebab-case ``type`` and that type's ``params``
    (``router.core.scorers``)."""

    type: str
    weight: float
    params: Any  # an instance of ``SCORERS[type].params``


@dataclass(frozen=True, slots=True)
class IndexSettings:
    """How the router models each engine's prefix cache."""

    engine_capacity_tokens: int = 1_000_000
    ttl_seconds: float | None = None
    max_entries: int = 4_000_000


@dataclass(frozen=True, slots=True)
class HotPrefix:
    """When a prefix is hot enough to copy to another engine before its holders saturate.

    ``spread_above``: requests sharing one prefix in flight per engine holding it. Above it,
    every candidate is scored as if it held the prefix too, so the request goes where the
    rest of the estimate is best (usually a less loaded engine, which then holds a copy);
    as the copies multiply, the requests per holder fall back below it and the prefix is
    kept together again. 0: never (a prefix spreads only once its holders' queues outweigh
    the prefill it saves).

    ``keep_younger_than_seconds``: a copy evicts the least recently used blocks of the engine
    taking it; only engines whose blocks to evict are at least this old (in the index's
    belief) are credited, so a hot prefix never pushes out prompts still in use in a small
    cache. 0: every engine is credited.
    """

    spread_above: float = 0.0
    keep_younger_than_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything one routing decision depends on, besides the fleet's state."""

    name: str
    description: str = ""
    block_chars: int = DEFAULT_BLOCK_CHARS
    bounded_load: BoundedLoad | None = None
    scorers: tuple[Scorer, ...] = ()
    picker: str = "max-score"  # a name in ``router.core.pickers.PICKERS``
    cold_prefix: ColdPrefix = "ring"
    index: IndexSettings = field(default_factory=IndexSettings)
    hot_prefix: HotPrefix = field(default_factory=HotPrefix)

    @property
    def block_tokens(self) -> int:
        return max(1, self.block_chars // CHARS_PER_TOKEN)

    @property
    def engine_capacity_blocks(self) -> int:
        return max(1, self.index.engine_capacity_tokens // self.block_tokens)


class _Fields(Fields):
    """The strict field reader, raising ``PolicyError``."""

    error = PolicyError


def _scorer(f: _Fields) -> Scorer:
    type_ = f.choice("type", "", SCORER_TYPES) if f.has("type") else f.text("type", "", True)
    if not f.has("weight"):
        f.fail(f.at("weight"), "is required: a scorer without a weight would not count")
    weight = f.number("weight", 0.0, 0.0, 1000.0)
    params = SCORERS[type_].parse(f)
    f.done()  # fields of another type are unknown here
    return Scorer(type_, weight, params)


def parse_policy(data: Any, where: str = "<policy>") -> Policy:
    """Decode a policy from parsed YAML; raise ``PolicyError`` naming ``where`` and the field."""
    f = _Fields(data, "", where)
    version = f.integer("version", 1, 1, 1)
    del version  # only version 1 exists; the field reserves the right to change the format
    name = f.text("name", "", required=True)
    description = f.text("description", "")
    block_chars = f.integer("block_chars", DEFAULT_BLOCK_CHARS, 16, 65_536)
    bounded: BoundedLoad | None = None
    for filt in f.items("filters"):
        kind = filt.choice("type", "", ("bounded-load",)) if filt.has("type") else ""
        if not kind:
            filt.fail(filt.at("type"), "is required")
        if bounded is not None:
            filt.fail(filt.path, "bounded-load is given twice")
        bounded = BoundedLoad(
            epsilon=filt.number("epsilon", 0.25, 0.0, 100.0),
            metric=cast(LoadMetric, filt.choice("metric", "requests", LOAD_METRICS)),
            min_cap=filt.integer("min_cap", 0, 0, 1_000_000),
        )
        filt.done()
    scorers = tuple(_scorer(s) for s in f.items("scorers"))
    picker = f.choice("picker", "max-score", PICKER_TYPES)
    cold = f.choice("cold_prefix", "ring", COLD_PREFIX)
    index = IndexSettings()
    idx = f.sub("index")
    if idx is not None:
        ttl = idx.number("ttl_seconds", 0.0, 0.0, 1e9)
        index = IndexSettings(
            engine_capacity_tokens=idx.integer("engine_capacity_tokens", 1_000_000, 1, 10**12),
            ttl_seconds=ttl or None,
            max_entries=idx.integer("max_entries", 4_000_000, 1_000, 10**9),
        )
        idx.done()
    hot = HotPrefix()
    hp = f.sub("hot_prefix")
    if hp is not None:
        hot = HotPrefix(
            spread_above=hp.number("spread_above", 0.0, 0.0, 1_000_000.0),
            keep_younger_than_seconds=hp.number("keep_younger_than_seconds", 0.0, 0.0, 1e9),
        )
        hp.done()
    f.done()

    # Cross-checks, with the path of the field at fault.
    seen: set[str] = set()
    for i, s in enumerate(scorers):
        if s.type in seen:
            f.fail(f"scorers[{i}].type", f"{s.type!r} is given twice")
        seen.add(s.type)
    scored = PICKERS[picker].scored
    if scored and not scorers:
        f.fail("scorers", f"picker {picker} needs at least one scorer")
    if not scored and scorers:
        f.fail("scorers", f"picker {picker} ignores scorers; remove them or use max-score")
    if scorers and not any(s.weight > 0 for s in scorers):
        f.fail("scorers", "at least one scorer needs a weight above 0")
    return Policy(
        name=name,
        description=description,
        block_chars=block_chars,
        bounded_load=bounded,
        scorers=scorers,
        picker=picker,
        cold_prefix=cast(ColdPrefix, cold),
        index=index,
        hot_prefix=hot,
    )


def load_policy_text(text: str, where: str) -> Policy:
    """Parse policy YAML text; errors name ``where``."""
    return parse_policy(parse_yaml(text, where, PolicyError), where)
