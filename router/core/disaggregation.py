"""Prefill/decode disaggregation, decided per request by what moving the KV cache costs.

An engine's ``role`` is ``prefill``, ``decode`` or ``both``. For each request the core picks
the engine it decodes on first (``decode`` and ``both`` engines: prefix overlap with its
conversation, load: the policy's own decision), then a prefill engine (``prefill`` and
``both``, never the same one), and compares, in seconds to the first token:

- ``whole`` on the decode engine: its queue and its prefill of the tokens it lacks, plus the
  stall that prefill inflicts on the sequences decoding beside it (a batch step that carries
  prefill work is longer for every sequence in it), weighed by ``decode_stall_weight``;
- ``split``: the prefill engine's queue and its prefill of the tokens *it* lacks, the
  transfer of the tokens the decode engine lacks over the link
  (``kv_bytes_per_token`` x tokens / ``link_gbps``), and the decode engine's wait for a batch
  slot (its decode half is admitted there like any request);
- ``whole`` on the prefill engine, where the protocol lets a prefill engine answer a request
  by itself (vLLM's connectors do; SGLang's prefill servers do not): its queue and prefill,
  plus the stall, charged on a prefill engine even with nothing decoding there yet (the
  request will decode beside the prefills that engine exists to run).

The split and the prefill engine's own answer share that engine's queue and prefill; then the
split waits for a batch slot on the decode engine, the answer decodes beside prefills. So the
prefill engine answers when the decode engine's slot wait is the longer and it beats the
decode engine's own prefill: when the decode pool's batches are full, work moves to the
prefill pool's free slots. The link is left out of that comparison (skipping a fast one saves
little, and the stall charged is a floor: a long answer meets many prefills). Otherwise split
wins when it is quicker than the decode engine's own prefill, and failing that the quicker of
the two whole paths (with a slow link the prefill pool serves as aggregated engines instead of
idling). A follow-up turn whose new tokens are few (under ``stay_below_tokens``) stays whole
on the decode engine holding its conversation: one round trip, nothing moved.

The arithmetic behind the defaults: bytes per token = 2 (K and V) x layers x KV heads x head
dim x bytes per value; an 8B Llama (32 layers, 8 KV heads, 128 dims, FP16) holds 131,072 bytes
per token, so a 4,000-token prompt is 524 MB: 42 ms over 100 Gbps, 0.42 s over 10 Gbps.

``decider`` may instead fix the path by a peer's rule (``always``, ``threshold``), for
operators who want that behaviour and for the simulator's comparisons; the estimates are still
made and shown.

Estimates are the ttft-estimate scorer's (``scorers.ttft_estimate.costs``: queued prefill,
batch-slot waits, running requests, KV pressure), in prefill tokens, turned into seconds at
``prefill_tokens_per_s``. Pure: the gateway and the simulator call ``decide`` alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from router.core.blocks import RoutingText, namespace_seed
from router.core.decision import RoutingCore
from router.core.precise import TokenPrompt
from router.core.scorers import ttft_estimate
from router.core.verdict import Decision

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")
WireProtocol = Literal["vllm", "sglang"]
PROTOCOLS: tuple[WireProtocol, ...] = ("vllm", "sglang")
Path = Literal["whole", "split"]
PATHS: tuple[Path, ...] = ("whole", "split")
# How the path is chosen: ``cost`` prices both (this module's point); ``always`` splits
# every request a prefill engine can take (SGLang's gateway, Dynamo once a prefill worker
# registers); ``threshold`` splits when the decode engine lacks at least
# ``threshold_tokens`` (llm-d's rule). The other two are there for operators who want a
# peer's behaviour, and so that the simulator compares all three through the same code.
Decider = Literal["cost", "always", "threshold"]
DECIDERS: tuple[Decider, ...] = ("cost", "always", "threshold")
# Why a path was taken (``Disaggregated.why``): the metrics' and /debug/route's words.
WHYS = (
    "no-prefill-engine",  # nothing to split onto: whole where it decodes
    "no-decode-engine",  # only prefill engines can take it: whole on one of them
    "few-new-tokens",  # the decode engine lacks under stay_below_tokens
    "split-cheaper",
    "whole-cheaper",
    "prefill-engine-cheaper",  # whole on the prefill engine (slow link, or full decode batches)
    "protocol-splits",  # the decode engine takes only split requests (SGLang's decode servers)
    "decider-always",  # decider: always
    "over-threshold",  # decider: threshold, and the decode engine lacks at least as many
    "under-threshold",  # decider: threshold, and it does not
)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What one token's KV cache weighs, from the model's attention shape."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # FP16 / BF16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value


# An 8B Llama in FP16: 131,072 bytes per token.
DEFAULT_KV_BYTES_PER_TOKEN = ModelShape(layers=32, kv_heads=8, head_dim=128).kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class DisaggSettings:
    """The ``disaggregation`` section: the wire protocol, the link and the costs it weighs."""

    protocol: WireProtocol = "vllm"
    link_gbps: float = 100.0  # the prefill-to-decode link, in gigabits per second
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    # Turns the estimates' prefill tokens into seconds, to set against the transfer's.
    prefill_tokens_per_s: float = 10_000.0
    # A request whose decode engine lacks fewer tokens than this stays whole there: a prefill
    # that fits one chunked-prefill step of vLLM's server (max_num_batched_tokens, 2,048 on
    # most GPUs) stalls the sequences beside it for one step, where a split would make the
    # prefill pool redo the conversation the decode engine already holds.
    stay_below_tokens: int = 2048
    # How much a decode engine's local prefill counts against it, per second of prefill,
    # when it has sequences decoding (they stall for it); 0: time to first token alone.
    decode_stall_weight: float = 1.0
    decider: Decider = "cost"
    # decider: threshold (16: what llm-d's P/D guide configures; its code defaults to 0).
    threshold_tokens: int = 16

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
        if self.link_gbps <= 0 or self.prefill_tokens_per_s <= 0:
            raise ValueError("link_gbps and prefill_tokens_per_s must be positive")
        if self.kv_bytes_per_token < 1 or self.stay_below_tokens < 0:
            raise ValueError("kv_bytes_per_token must be positive, stay_below_tokens >= 0")
        if self.decode_stall_weight < 0:
            raise ValueError("decode_stall_weight must be >= 0")
        if self.decider not in DECIDERS or self.threshold_tokens < 0:
            raise ValueError(f"decider must be one of {', '.join(DECIDERS)}, threshold >= 0")

    def serves_whole(self, role: Role) -> bool:
        """An engine of ``role`` answers a plain request by itself: any engine with vLLM's
        connectors; with SGLang's only a ``both`` engine (its prefill and decode servers
        need the other side of every request)."""
        return self.protocol == "vllm" or role == "both"

    def transfer_bytes(self, tokens: int) -> int:
        return max(0, tokens) * self.kv_bytes_per_token

    def transfer_seconds(self, tokens: int) -> float:
        return self.transfer_bytes(tokens) * 8 / (self.link_gbps * 1e9)


@dataclass(frozen=True, slots=True)
class Disaggregated:
    """Where one request runs: ``whole`` on ``engine``, or ``split`` (prefill on
    ``prefill_engine``, decode on ``engine``); with both estimates and why."""

    path: Path
    engine: str | None  # where the answer comes from (None: nowhere)
    prefill_engine: str | None  # split: where the prompt is prefilled
    why: str  # one of WHYS
    decode: Decision | None  # the decode-side decision (None: no decode engine)
    prefill: Decision | None  # the prefill-side decision (None: no prefill engine)
    whole_seconds: float | None  # estimated time to first token, whole on the decode engine
    split_seconds: float | None  # ... split (None: no prefill engine)
    prefill_whole_seconds: float | None  # ... whole on the prefill engine (None: not allowed)
    transfer_tokens: int  # the tokens the decode engine lacks, moved on the split path
    transfer_bytes: int
    transfer_seconds: float

    @property
    def decision(self) -> Decision | None:
        """The decision whose engine answers: its plan, fallbacks and explanation."""
        if self.path == "whole" and self.engine is not None and self.engine == self.prefill_engine:
            return self.prefill
        return self.decode if self.decode is not None else self.prefill

    def explain(self) -> dict[str, Any]:
        """A JSON-ready account: both estimates, the transfer and the path chosen."""

        def secs(v: float | None) -> float | None:
            return None if v is None else round(v, 6)

        return {
            "path": self.path,
            "engine": self.engine,
            "prefill_engine": self.prefill_engine if self.path == "split" else None,
            "why": self.why,
            "estimates": {
                "whole_seconds": secs(self.whole_seconds),
                "split_seconds": secs(self.split_seconds),
                "prefill_whole_seconds": secs(self.prefill_whole_seconds),
            },
            "transfer": {
                "tokens": self.transfer_tokens,
                "bytes": self.transfer_bytes,
                "seconds": secs(self.transfer_seconds),
            },
            "decode": None if self.decode is None else self.decode.explain(),
            "prefill": None if self.prefill is None else self.prefill.explain(),
        }


def _ttft_params(core: RoutingCore) -> ttft_estimate.Params:
    for s in core.policy.scorers:
        if s.type == ttft_estimate.NAME:
            return s.params  # type: ignore[no-any-return]
    return ttft_estimate.Params()


def _estimate(d: Decision, engine: str, p: ttft_estimate.Params) -> tuple[float, int, int]:
    """(prefill tokens before the first token, uncached tokens, running requests) on
    ``engine`` as ``d`` saw it."""
    x = d.inputs
    i = x.candidates.index(engine)
    cost = ttft_estimate.costs(p, x)[i]
    waiting = x.waiting[i] if x.waiting else 0
    return cost, x.uncached(i), max(0, x.requests[i] - waiting)


def _slot_wait(d: Decision, engine: str, p: ttft_estimate.Params) -> float:
    """The prefill tokens ``costs`` charges on ``engine`` for the batch slots a request sent
    now would wait for there."""
    x = d.inputs
    if not x.waiting:
        return 0.0
    wait_tokens, _ = ttft_estimate.in_router_tokens(p, x)
    return float(wait_tokens * x.waiting[x.candidates.index(engine)])


def _pending(d: Decision, engine: str) -> int:
    """Tokens ``engine`` holds of the prompt only provisionally: an attempt in flight (a
    transfer not landed yet, a prefill not finished) that a local prefill cannot reuse."""
    i = d.inputs.candidates.index(engine)
    return d.predicted[i] * d.inputs.block_tokens if d.predicted else 0


def decide(
    core: RoutingCore,
    body: Mapping[str, Any] | RoutingText,
    roles: Mapping[str, Role],
    candidates: Sequence[str],
    now: float,
    settings: DisaggSettings,
    session: str | None = None,
    prompt_tokens: int | None = None,
    *,
    tokenized: TokenPrompt | None = None,
) -> Disaggregated:
    """The path and engines for ``body`` among ``candidates`` (each with its role in
    ``roles``; an engine not named there does both). Changes nothing."""
    rt, keys = core.keys_of(body)
    tokens = rt.approx_tokens if prompt_tokens is None else prompt_tokens
    if prompt_tokens is None and tokenized is not None and rt.text is not None:
        tokens = tokenized.prompt_tokens(len(rt.text))
    seed = namespace_seed(rt.namespace)

    def pick(among: Sequence[str]) -> Decision | None:
        if not among:
            return None
        return core.decide_keys(keys, tokens, among, now, session, seed, tokenized=tokenized)

    decoders = [e for e in candidates if roles.get(e, "both") != "prefill"]
    dd = pick(decoders)
    d_engine = dd.engine if dd is not None else None
    prefillers = [e for e in candidates if roles.get(e, "both") != "decode" and e != d_engine]
    return choose(core, settings, dd, pick(prefillers), roles)


def choose(
    core: RoutingCore,
    settings: DisaggSettings,
    dd: Decision | None,
    pd: Decision | None,
    roles: Mapping[str, Role],
) -> Disaggregated:
    """The cheapest path given the decode-side and prefill-side decisions."""
    params = _ttft_params(core)
    rate = settings.prefill_tokens_per_s
    d_engine = dd.engine if dd is not None else None
    p_engine = pd.engine if pd is not None else None
    p_whole_ok = p_engine is not None and settings.serves_whole(roles.get(p_engine, "both"))
    p_cost = p_whole = None
    if pd is not None and p_engine is not None:
        cost, uncached, running = _estimate(pd, p_engine, params)
        p_cost = cost / rate
        if p_whole_ok:
            # With nothing decoding beside its prefill, the request itself will decode beside
            # the prefills a prefill engine goes on to run.
            beside = running or roles.get(p_engine, "both") == "prefill"
            stall = settings.decode_stall_weight * uncached if beside else 0.0
            p_whole = (cost + stall) / rate

    if dd is None or d_engine is None:
        if p_whole is not None:
            return _whole(p_engine, "no-decode-engine", dd, pd, None, None, p_whole, settings, 0)
        return _whole(None, "no-decode-engine", dd, pd, None, None, None, settings, 0)

    cost, lacks, running = _estimate(dd, d_engine, params)
    stall = settings.decode_stall_weight * lacks if running else 0.0
    whole = (cost + stall) / rate
    d_whole_ok = settings.serves_whole(roles.get(d_engine, "both"))
    if p_cost is None:
        engine = d_engine if d_whole_ok else None
        return _whole(engine, "no-prefill-engine", dd, pd, whole, None, None, settings, lacks)
    move = settings.transfer_seconds(lacks)
    queued = p_cost + _slot_wait(dd, d_engine, params) / rate  # the split's waits, link aside
    split = queued + move
    fixed = _fixed_rule(settings, lacks, d_whole_ok)
    if fixed is not None:
        if fixed in ("protocol-splits", "decider-always", "over-threshold"):
            return Disaggregated(
                "split", d_engine, p_engine, fixed, dd, pd, whole if d_whole_ok else None,
                split, p_whole, lacks, settings.transfer_bytes(lacks), move,
            )  # fmt: skip
        return _whole(d_engine, fixed, dd, pd, whole, split, p_whole, settings, lacks)
    if lacks + _pending(dd, d_engine) < settings.stay_below_tokens:
        return _whole(d_engine, "few-new-tokens", dd, pd, whole, split, p_whole, settings, lacks)
    # Whole on the prefill engine when its decoding stall is shorter than the split's wait for
    # a decode batch slot (the decode pool is full) and it beats the decode engine's prefill;
    # else split when that beats the decode engine's own prefill; when it does not pay, the
    # prefill pool may serve as aggregated engines: whole on the prefill engine if quicker.
    if p_whole is not None and p_whole < whole and p_whole < queued:
        return _whole(
            p_engine, "prefill-engine-cheaper", dd, pd, whole, split, p_whole, settings, lacks
        )
    if split < whole:
        return Disaggregated(
            "split", d_engine, p_engine, "split-cheaper", dd, pd, whole, split, p_whole,
            lacks, settings.transfer_bytes(lacks), move,
        )  # fmt: skip
    if p_whole is not None and p_whole < whole:
        return _whole(
            p_engine, "prefill-engine-cheaper", dd, pd, whole, split, p_whole, settings, lacks
        )
    return _whole(d_engine, "whole-cheaper", dd, pd, whole, split, p_whole, settings, lacks)


def _fixed_rule(settings: DisaggSettings, lacks: int, d_whole_ok: bool) -> str | None:
    """The path a rule fixes before any price is compared (a WHYS word), or None."""
    if not d_whole_ok:
        return "protocol-splits"
    if settings.decider == "always":
        return "decider-always"
    if settings.decider == "threshold":
        return "over-threshold" if lacks >= settings.threshold_tokens else "under-threshold"
    return None


def _whole(
    engine: str | None,
    why: str,
    dd: Decision | None,
    pd: Decision | None,
    whole: float | None,
    split: float | None,
    p_whole: float | None,
    settings: DisaggSettings,
    lacks: int,
) -> Disaggregated:
    return Disaggregated(
        "whole", engine, pd.engine if pd is not None else None, why, dd, pd, whole, split,
        p_whole, lacks, settings.transfer_bytes(lacks), settings.transfer_seconds(lacks),
    )  # fmt: skip
