"""A routing policy: the YAML file's model, and its strict loader.

Loading is two-phase, like llm-d's scheduler config: first a strict decode of every field with
its default and limits (unknown keys and wrong types are errors), then cross-checks between
fields. Every error names the file, the field path and the reason, for example
``policies/x.yaml: scorers[1].weight: must be a number >= 0, got 'high'``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from router.core.blocks import CHARS_PER_TOKEN
from router.core.fields import Fields, parse_yaml, read_yaml_file

# 512 characters, about 128 tokens. Measured with `kvrouter simulate` (bench/RESULTS.md):
# 128 to 1024 give the same hit ratio on chat and Mooncake workloads, and each halving of the
# block doubles the hashing and recording per request; 512 is the smallest block at which
# an 8K-token prompt decides in about 100 us with 64 engines.
DEFAULT_BLOCK_CHARS = 512

LoadMetric = Literal["requests", "tokens"]
PickerType = Literal["max-score", "round-robin", "ring"]
ColdPrefix = Literal["ring", "score"]

LOAD_METRICS: tuple[LoadMetric, ...] = ("requests", "tokens")
PICKERS: tuple[PickerType, ...] = ("max-score", "round-robin", "ring")
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
    """A weighted scorer; ``type`` is its registered kebab-case name."""

    type: str
    weight: float
    metric: LoadMetric = "requests"
    header: str = "x-session-id"
    user_field: bool = True
    max_sessions: int = 100_000
    # ttft-estimate: prefill-token equivalents charged per request queued inside the engine
    # and per request in its batch, and the KV cache use above which cached overlap is
    # discounted (a full cache evicts the prefix the router is counting on).
    wait_tokens: int = 2048
    running_tokens: int = 128
    kv_pressure: float = 0.9


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
    """

    spread_above: float = 0.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything one routing decision depends on, besides the fleet's state."""

    name: str
    description: str = ""
    block_chars: int = DEFAULT_BLOCK_CHARS
    bounded_load: BoundedLoad | None = None
    scorers: tuple[Scorer, ...] = ()
    picker: PickerType = "max-score"
    cold_prefix: ColdPrefix = "ring"
    index: IndexSettings = field(default_factory=IndexSettings)
    hot_prefix: HotPrefix = field(default_factory=HotPrefix)

    @property
    def block_tokens(self) -> int:
        return max(1, self.block_chars // CHARS_PER_TOKEN)

    @property
    def engine_capacity_blocks(self) -> int:
        return max(1, self.index.engine_capacity_tokens // self.block_tokens)

    def scorer(self, type_: str) -> Scorer | None:
        return next((s for s in self.scorers if s.type == type_), None)


# The scorers a policy may name; ``router.core.scoring`` implements each.
SCORER_TYPES = ("prefix-overlap", "prefill-cost", "ttft-estimate", "load", "session-affinity")


class _Fields(Fields):
    """The strict field reader, raising ``PolicyError``."""

    error = PolicyError


def _scorer(f: _Fields) -> Scorer:
    type_ = f.choice("type", "", SCORER_TYPES) if f.has("type") else f.text("type", "", True)
    if not f.has("weight"):
        f.fail(f.at("weight"), "is required: a scorer without a weight would not count")
    weight = f.number("weight", 0.0, 0.0, 1000.0)
    if type_ == "load":
        s = Scorer(
            type_, weight, metric=cast(LoadMetric, f.choice("metric", "requests", LOAD_METRICS))
        )
    elif type_ == "session-affinity":
        s = Scorer(
            type_,
            weight,
            header=f.text("header", "x-session-id").lower(),
            user_field=f.flag("user_field", True),
            max_sessions=f.integer("max_sessions", 100_000, 1, 10_000_000),
        )
    elif type_ == "ttft-estimate":
        s = Scorer(
            type_,
            weight,
            wait_tokens=f.integer("wait_tokens", 2048, 0, 10_000_000),
            running_tokens=f.integer("running_tokens", 128, 0, 10_000_000),
            kv_pressure=f.number("kv_pressure", 0.9, 0.0, 1.0),
        )
    else:
        s = Scorer(type_, weight)
    f.done()
    return s


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
    picker = f.choice("picker", "max-score", PICKERS)
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
        hot = HotPrefix(spread_above=hp.number("spread_above", 0.0, 0.0, 1_000_000.0))
        hp.done()
    f.done()

    # Cross-checks, with the path of the field at fault.
    seen: set[str] = set()
    for i, s in enumerate(scorers):
        if s.type in seen:
            f.fail(f"scorers[{i}].type", f"{s.type!r} is given twice")
        seen.add(s.type)
    if picker == "max-score" and not scorers:
        f.fail("scorers", "picker max-score needs at least one scorer")
    if picker != "max-score" and scorers:
        f.fail("scorers", f"picker {picker} ignores scorers; remove them or use max-score")
    if scorers and not any(s.weight > 0 for s in scorers):
        f.fail("scorers", "at least one scorer needs a weight above 0")
    return Policy(
        name=name,
        description=description,
        block_chars=block_chars,
        bounded_load=bounded,
        scorers=scorers,
        picker=cast(PickerType, picker),
        cold_prefix=cast(ColdPrefix, cold),
        index=index,
        hot_prefix=hot,
    )


def load_policy_text(text: str, where: str) -> Policy:
    """Parse policy YAML text; errors name ``where``."""
    return parse_policy(parse_yaml(text, where, PolicyError), where)


def load_policy(path: str | Path) -> Policy:
    """Read and parse a policy file."""
    data, where = read_yaml_file(path, PolicyError)
    return parse_policy(data, where)
