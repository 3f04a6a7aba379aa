"""Workloads for the simulator: trace records as requests, and a synthetic generator.

A ``TraceRequest`` carries what the router sees (an OpenAI body) and what the engine model
needs (prompt and output lengths, and the prompt's cacheable blocks at the engine's own
granularity). Mooncake records name their prompt as 512-token blocks (``hash_ids``); each id
expands deterministically to the same synthetic text, four characters per token, so the
router's real text path (canonical text, block keys, index) runs on every replay while the
engine model caches exactly the blocks the trace says are shared.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.core.blocks import CHARS_PER_TOKEN, block_keys, chain_keys, routing_text

MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_MODEL = "mooncake"
# Engine-side block size for traces of request bodies: vLLM's default KV block.
BODY_ENGINE_BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a replay: arrival, the body to route, and the engine model's inputs."""

    timestamp: float  # seconds from the start of the trace
    body: Mapping[str, Any] | None
    prompt_tokens: int
    output_tokens: int
    engine_keys: Sequence[int]  # the prompt's full blocks at the engine's granularity
    engine_block_tokens: int
    hash_ids: Sequence[int] = ()  # Mooncake: the body is built from these on demand
    session: str | None = None

    def request_body(self) -> Mapping[str, Any]:
        """The OpenAI body the router routes (Mooncake bodies are expanded only when needed)."""
        if self.body is not None:
            return self.body
        return mooncake_body(self.hash_ids, self.prompt_tokens, self.output_tokens)


def _block_text(hash_id: int) -> str:
    # 2048 characters: a word of 8 characters (7 hex digits and a space) per two tokens.
    return f"{hash_id:07x} " * (MOONCAKE_BLOCK_TOKENS * CHARS_PER_TOKEN // 8)


def mooncake_body(hash_ids: Sequence[int], input_length: int, output_length: int) -> dict[str, Any]:
    """A completions body whose prompt is the trace's blocks as text, cut to input_length."""
    text = "".join(_block_text(h) for h in hash_ids)[: input_length * CHARS_PER_TOKEN]
    return {"model": MOONCAKE_MODEL, "prompt": text, "max_tokens": output_length}


class TraceFormatError(ValueError):
    """A trace record that is not one of the known formats; the message says which field."""


def _int_field(rec: Mapping[str, Any], name: str, where: str) -> int:
    v = rec.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TraceFormatError(f"{where}: '{name}' must be a non-negative integer, got {v!r}")
    return v


def from_mooncake(rec: Mapping[str, Any], where: str) -> TraceRequest:
    """A Mooncake record: timestamp (ms), input_length, output_length, hash_ids."""
    ids = rec.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
        raise TraceFormatError(f"{where}: 'hash_ids' must be a list of integers")
    ts = rec.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        raise TraceFormatError(f"{where}: 'timestamp' must be a non-negative number (ms)")
    n_in = _int_field(rec, "input_length", where)
    n_out = _int_field(rec, "output_length", where)
    full = min(len(ids), n_in // MOONCAKE_BLOCK_TOKENS)
    seed = 0x6D6F6F6E  # any fixed seed: engine keys only need to be equal for equal prefixes
    keys = chain_keys((h.to_bytes(8, "little", signed=True) for h in ids[:full]), seed)
    return TraceRequest(
        timestamp=ts / 1000.0,
        body=None,
        prompt_tokens=n_in,
        output_tokens=n_out,
        engine_keys=keys,
        engine_block_tokens=MOONCAKE_BLOCK_TOKENS,
        hash_ids=tuple(ids),
    )


def from_body(rec: Mapping[str, Any], where: str) -> TraceRequest:
    """A record of the project's own format: an OpenAI body plus ``timestamp`` (seconds)."""
    ts = rec.get("timestamp", 0)
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        raise TraceFormatError(f"{where}: 'timestamp' must be a non-negative number (seconds)")
    body = {k: v for k, v in rec.items() if k not in ("timestamp", "session")}
    try:
        rt = routing_text(body)
    except ValueError as e:
        raise TraceFormatError(f"{where}: {e}") from None
    engine_chars = BODY_ENGINE_BLOCK_TOKENS * CHARS_PER_TOKEN
    out = body.get("max_tokens", body.get("max_completion_tokens", 128))
    session = rec.get("session", body.get("user"))
    return TraceRequest(
        timestamp=float(ts),
        body=body,
        prompt_tokens=max(1, rt.approx_tokens),
        output_tokens=out if isinstance(out, int) and out > 0 else 128,
        engine_keys=block_keys(rt, engine_chars),
        engine_block_tokens=BODY_ENGINE_BLOCK_TOKENS,
        session=session if isinstance(session, str) else None,
    )


def parse_record(rec: Any, where: str) -> TraceRequest:
    """Either format, told apart by its fields."""
    if not isinstance(rec, Mapping):
        raise TraceFormatError(f"{where}: a record must be a JSON object")
    if "hash_ids" in rec:
        return from_mooncake(rec, where)
    if "messages" in rec or "prompt" in rec:
        return from_body(rec, where)
    raise TraceFormatError(
        f"{where}: neither a Mooncake record (hash_ids) nor an OpenAI body (messages or prompt)"
    )


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """A multi-tenant chat workload: Zipf-popular system prompts, conversations that grow."""

    requests: int = 4000
    tenants: int = 40
    zipf_s: float = 1.1
    system_prompt_words: int = 1500
    conversations: int = 600
    turn_words: tuple[int, int] = (30, 300)
    answer_words: tuple[int, int] = (50, 400)
    rate_per_s: float = 8.0
    seed: int = 7


class _Chat:
    """The multi-tenant chat of a ``SyntheticSpec``: one request at a time, in arrival order."""

    def __init__(self, spec: SyntheticSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.vocabulary = [f"w{i:x}" for i in range(4096)]
        self.weights = [1.0 / (i + 1) ** spec.zipf_s for i in range(spec.tenants)]
        self.systems = [
            f"tenant {t} instructions: {self.words(spec.system_prompt_words)}"
            for t in range(spec.tenants)
        ]
        self.convs: list[list[dict[str, str]]] = []
        self.conv_tenant: list[int] = []

    def words(self, n: int) -> str:
        return " ".join(self.rng.choices(self.vocabulary, k=n))

    def request(self, i: int, t: float) -> TraceRequest:
        spec, rng, convs = self.spec, self.rng, self.convs
        # New conversations while the pool fills, then mostly follow-up turns.
        if len(convs) < spec.conversations and (not convs or rng.random() < 0.5):
            tenant = rng.choices(range(spec.tenants), self.weights)[0]
            convs.append([{"role": "system", "content": self.systems[tenant]}])
            self.conv_tenant.append(tenant)
            c = len(convs) - 1
        else:
            c = rng.randrange(len(convs))
        msgs = convs[c]
        msgs.append({"role": "user", "content": self.words(rng.randint(*spec.turn_words))})
        answer = rng.randint(*spec.answer_words)
        body = {"model": "synthetic", "messages": list(msgs), "max_tokens": answer}
        rec = dict(body, timestamp=t, session=f"conv-{c}")
        out = from_body(rec, f"synthetic[{i}]")
        msgs.append({"role": "assistant", "content": self.words(answer)})
        if len(msgs) > 40:  # a conversation ends; its slot starts a new one next time
            convs[c] = [{"role": "system", "content": self.systems[self.conv_tenant[c]]}]
        return out


def synthetic(spec: SyntheticSpec) -> Iterator[TraceRequest]:
    """Requests of ``spec``'s workload in arrival order (deterministic for a seed)."""
    rng = random.Random(spec.seed)
    chat = _Chat(spec, rng)
    t = 0.0
    for i in range(spec.requests):
        t += rng.expovariate(spec.rate_per_s)
        yield chat.request(i, t)


@dataclass(frozen=True, slots=True)
class HotspotSpec:
    """A viral document on top of multi-tenant chat: one long prompt many users ask about.

    A share of requests (``document_share``, ``burst_share`` during the burst window, when the
    arrival rate is also ``burst_rate_x`` higher) are a question about the same document,
    answered at length; the rest is the chat of ``chat``. With 8 engines at the defaults the
    document's requests alone would fill more than one engine's batch during the burst.
    """

    chat: SyntheticSpec = SyntheticSpec()
    document_words: int = 5000  # about 8,000 tokens
    question_words: tuple[int, int] = (10, 60)
    answer_words: tuple[int, int] = (300, 800)  # long answers: the batch stays occupied
    document_share: float = 0.2
    burst_share: float = 0.45
    burst_start_s: float = 120.0
    burst_seconds: float = 120.0
    burst_rate_x: float = 1.5


def hotspot(spec: HotspotSpec) -> Iterator[TraceRequest]:
    """Requests of ``spec``'s workload in arrival order (deterministic for the chat's seed)."""
    rng = random.Random(spec.chat.seed)
    chat = _Chat(spec.chat, rng)
    document = f"document: {chat.words(spec.document_words)}"
    burst_end = spec.burst_start_s + spec.burst_seconds
    t = 0.0
    for i in range(spec.chat.requests):
        burst = spec.burst_start_s <= t < burst_end
        rate = spec.chat.rate_per_s * (spec.burst_rate_x if burst else 1.0)
        t += rng.expovariate(rate)
        share = spec.burst_share if burst else spec.document_share
        if rng.random() >= share:
            yield chat.request(i, t)
            continue
        question = chat.words(rng.randint(*spec.question_words))
        answer = rng.randint(*spec.answer_words)
        body = {
            "model": "synthetic",
            "messages": [
                {"role": "system", "content": "Answer questions about the document."},
                {"role": "user", "content": f"{document}\n\nquestion: {question}"},
            ],
            "max_tokens": answer,
            "timestamp": t,
        }
        yield from_body(body, f"hotspot[{i}]")
