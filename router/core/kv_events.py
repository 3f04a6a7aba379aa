"""Engines' KV cache events: the wire format (vLLM, SGLang) decoded into values, with no I/O.

vLLM (0.9 onwards) and SGLang publish every block their prefix cache stores or evicts on a ZMQ
PUB socket, one multipart message per batch::

    [topic, seq (8 bytes, big-endian), payload]

``payload`` is msgpack of a positional array ``[timestamp, events, data_parallel_rank]`` (the
rank is absent in old releases). Each event is a tagged union in one of two encodings:

- an array ``["BlockStored", field1, field2, ...]`` in field order, trailing fields that hold
  their default dropped (vLLM before 0.24);
- a map ``{"type": "BlockStored", "field": value, ...}``, fields holding their default omitted
  (0.24 onwards).

Events, fields in order: ``BlockStored`` (block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind),
``BlockRemoved`` (block_hashes, medium, group_idx), ``AllBlocksCleared`` (). A block hash is a
uint64 (or int64) integer or bytes of 8, 16 or 32 (sha256) bytes, depending on the release and
the engine's hash setting.

Decoding never raises: malformed input (truncated msgpack, wrong types, oversized arrays,
hashes of the wrong size, token counts that are not whole blocks) drops the batch or the event
and is counted; unknown fields and event types are counted and ignored, so a newer engine
keeps working with an older router. Every array is capped (``MAX_ARRAY``) before it is built.

The decoded events become index changes in ``core.engine_blocks``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]  # ships no type information

Hash = int | bytes

# Caps applied while unpacking, before anything is allocated: one batch of one engine step
# stores at most a few thousand blocks; 1M array items (8 MB of token ids) is far above that.
MAX_ARRAY = 1 << 20
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_BLOCK_SIZE = 1 << 16
HASH_BYTES = frozenset({8, 16, 32})
# The end marker of a replay: sequence number -1 as 8 signed big-endian bytes.
END_SEQ = -1

_INT = frozenset({int})


class Malformed(ValueError):
    """Input that breaks the format; the message says which part and why."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine cached: their hashes, the parent of the first, their tokens."""

    block_hashes: tuple[Hash, ...]
    parent_block_hash: Hash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted (from ``medium``; None means the GPU)."""

    block_hashes: tuple[Hash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine emptied its prefix cache."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    """One published batch: the engine's timestamp, its events, its data-parallel rank."""

    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


@dataclass(slots=True)
class Counts:
    """What decoding saw; only ever counts up (the metrics read it)."""

    batches: int = 0
    events: dict[str, int] = field(default_factory=dict)
    malformed: int = 0  # batches or events dropped for breaking the format
    unknown_events: int = 0
    unknown_fields: int = 0

    def event(self, kind: str) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1


# -- field readers: each returns the value or raises Malformed --------------------------------


def _hash(v: Any) -> Hash:
    if isinstance(v, bool):
        raise Malformed("a block hash must be an integer or bytes")
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 64):
            raise Malformed(f"block hash {v} does not fit 64 bits")
        return v
    if isinstance(v, bytes):
        if len(v) not in HASH_BYTES:
            raise Malformed(f"a block hash of {len(v)} bytes (8, 16 or 32 expected)")
        return v
    raise Malformed(f"a block hash must be an integer or bytes, got {type(v).__name__}")


def _hashes(v: Any) -> tuple[Hash, ...]:
    if not isinstance(v, list):
        raise Malformed("block_hashes must be an array")
    # One event names every block of a prompt (a thousand for 16,000 tokens): the common
    # shapes, all integers in range or all bytes of one allowed size, are checked in C.
    if v:
        kinds = set(map(type, v))
        if kinds == {int} and min(v) >= -(1 << 63) and max(v) < (1 << 64):
            return tuple(v)
        if kinds == {bytes} and set(map(len, v)) <= HASH_BYTES:
            return tuple(v)
    return tuple(_hash(h) for h in v)  # mixed or bad: item by item, to say which is wrong


def _opt_hash(v: Any) -> Hash | None:
    return None if v is None else _hash(v)


def token_array(v: Sequence[Any]) -> array[int] | None:
    """``v`` packed as 32-bit ids, or None when an item is not an int (bools are not) from 0
    to 2**32 - 1.

    Checked in C (the set of types, then ``array`` refusing what does not fit), never item
    by item in Python: a long prompt's ids arrive in every event and every tokenization, and
    a Python loop over 100,000 of them cost the router more than the rest of a decision
    (bench/RESULTS.md, KV events live).
    """
    if v and set(map(type, v)) != _INT:
        return None
    try:
        return array("I", v)
    except OverflowError:
        return None


def _tokens(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise Malformed("token_ids must be an array")
    if token_array(v) is None:
        raise Malformed("token_ids must be non-negative 32-bit integers")
    return tuple(v)


def _block_size(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_BLOCK_SIZE:
        raise Malformed(f"block_size must be an integer from 1 to {MAX_BLOCK_SIZE}")
    return v


def _opt_int(v: Any) -> int | None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
        raise Malformed("expected an integer or nil")
    return v


def _opt_str(v: Any) -> str | None:
    if v is not None and not isinstance(v, str):
        raise Malformed("expected a string or nil")
    return v


def _opt_list(v: Any) -> tuple[Any, ...] | None:
    if v is not None and not isinstance(v, list):
        raise Malformed("expected an array or nil")
    return None if v is None else tuple(v)


Reader = Callable[[Any], Any]
# Per event type: its fields in wire order, how each is read, and how many are required.
_SCHEMA: Mapping[str, tuple[type[Any], tuple[tuple[str, Reader], ...], int]] = {
    "BlockStored": (
        BlockStored,
        (
            ("block_hashes", _hashes),
            ("parent_block_hash", _opt_hash),
            ("token_ids", _tokens),
            ("block_size", _block_size),
            ("lora_id", _opt_int),
            ("medium", _opt_str),
            ("lora_name", _opt_str),
            ("extra_keys", _opt_list),
            ("group_idx", _opt_int),
            ("kv_cache_spec_kind", _opt_str),
        ),
        4,
    ),
    "BlockRemoved": (BlockRemoved, (("block_hashes", _hashes), ("medium", _opt_str)), 1),
    "AllBlocksCleared": (AllBlocksCleared, (), 0),
}
_NILABLE: frozenset[Reader] = frozenset({_opt_hash})
# Fields a newer BlockRemoved carries that the router reads by name only.
_MAP_ONLY: Mapping[str, tuple[tuple[str, Reader], ...]] = {
    "BlockRemoved": (("group_idx", _opt_int),),
}


def _event(raw: Any, counts: Counts) -> Event | None:
    """One event in either encoding; None (counted) when unknown or malformed."""
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, values = raw[0], raw[1:]
        spec = _SCHEMA.get(tag)
        if spec is None:
            counts.unknown_events += 1
            return None
        cls, fields, required = spec
        if len(values) < required:
            raise Malformed(f"{tag} has {len(values)} fields, needs {required}")
        if len(values) > len(fields):
            counts.unknown_fields += len(values) - len(fields)
        kwargs = {name: read(v) for (name, read), v in zip(fields, values, strict=False)}
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag = raw["type"]
        spec = _SCHEMA.get(tag)
        if spec is None:
            counts.unknown_events += 1
            return None
        cls, fields, required = spec
        known = dict(fields + _MAP_ONLY.get(tag, ()))
        kwargs = {}
        for name, v in raw.items():
            read = known.get(name)
            if read is not None:
                kwargs[name] = read(v)
            elif name != "type":
                counts.unknown_fields += 1
        # A required field that may be nil (parent_block_hash) may also be left out.
        missing = [
            name for name, read in fields[:required] if name not in kwargs and read not in _NILABLE
        ]
        if missing:
            raise Malformed(f"{tag} lacks {', '.join(missing)}")
        for name, _ in fields[:required]:
            kwargs.setdefault(name, None)  # only the nil-able ones can be missing here
    else:
        raise Malformed("an event must be a tagged array or a map with a 'type'")
    event: Event = cls(**kwargs)
    if isinstance(event, BlockStored) and len(event.token_ids) != (
        len(event.block_hashes) * event.block_size
    ):
        raise Malformed("BlockStored token_ids are not block_size tokens per block")
    counts.event(tag)
    return event


def unpack(payload: bytes) -> Any:
    """msgpack -> Python values with every array, map and string capped; raises ``Malformed``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise Malformed(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_ARRAY,
            max_map_len=MAX_ARRAY,
            max_bin_len=MAX_PAYLOAD_BYTES,
            max_str_len=MAX_PAYLOAD_BYTES,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"not msgpack: {type(e).__name__}") from None


def decode_batch(payload: bytes, counts: Counts) -> Batch | None:
    """A batch from its msgpack payload; None (counted as malformed) when it breaks the format.

    Events that break the format or are unknown are dropped one by one (and counted); the
    rest of the batch is kept.
    """
    try:
        raw = unpack(payload)
        if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
            raise Malformed("a batch must be [timestamp, events] or [timestamp, events, rank]")
        ts, events = raw[0], raw[1]
        if not isinstance(ts, int | float) or isinstance(ts, bool):
            raise Malformed("the batch timestamp must be a number")
        if not isinstance(events, list):
            raise Malformed("the batch's events must be an array")
        rank = _opt_int(raw[2]) if len(raw) == 3 else None
    except Malformed:
        counts.malformed += 1
        return None
    out: list[Event] = []
    for e in events:
        try:
            event = _event(e, counts)
        except (Malformed, TypeError):
            counts.malformed += 1
            continue
        if event is not None:
            out.append(event)
    counts.batches += 1
    return Batch(float(ts), tuple(out), rank)


def split_message(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """A published message ``[topic, seq, payload]`` -> its parts; raises ``Malformed``."""
    if len(frames) != 3:
        raise Malformed(f"a message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise Malformed(f"the sequence number has {len(seq)} bytes, not 8")
    return bytes(topic), int.from_bytes(seq, "big", signed=True), bytes(payload)


def split_replay(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """A replay reply -> (seq, payload); None for the end marker; raises ``Malformed``.

    Two framings: ``[b"", seq, payload]`` (vLLM before 0.26) and ``[b"", topic, seq, payload]``
    (0.26 onwards); the end marker carries sequence number -1.
    """
    if len(frames) == 3:
        empty, seq, payload = frames
    elif len(frames) == 4:
        empty, _topic, seq, payload = frames
    else:
        raise Malformed(f"a replay reply has 3 or 4 frames, got {len(frames)}")
    if empty or len(seq) != 8:
        raise Malformed("a replay reply starts with an empty frame and an 8-byte sequence")
    n = int.from_bytes(seq, "big", signed=True)
    return None if n == END_SEQ else (n, bytes(payload))
