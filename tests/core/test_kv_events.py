"""KV cache events decoded: byte-exact fixtures of both encodings, framings, fuzzing.

The fixtures are msgpack written out by hand, byte by byte, from the format (not produced by
any encoder of this project): a fixarray is 0x90 | n, a fixstr 0xa0 | n, nil 0xc0, a float64
0xcb, a uint64 0xcf, bin8 0xc4 and a fixmap 0x80 | n.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.engine_blocks import EngineBlocks
from router.core.kv_events import (
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    Counts,
    Malformed,
    decode_batch,
    split_message,
    split_replay,
    token_array,
)

FLOAT_1_5 = b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"
BIG_HASH = 0xFEDCBA9876543210
BIG_HASH_BYTES = b"\xcf\xfe\xdc\xba\x98\x76\x54\x32\x10"
SHA = bytes(range(32))

# vLLM < 0.24: [ts, [event...], rank], each event an array tagged by its first item.
ARRAY_BATCH = (
    b"\x93"  # [ts, events, rank]
    + FLOAT_1_5
    + b"\x93"  # three events
    # ["BlockStored", [7, BIG], nil, [1..8], 4, nil, "GPU"]
    + b"\x97\xabBlockStored"
    + b"\x92\x07"
    + BIG_HASH_BYTES
    + b"\xc0"
    + b"\x98\x01\x02\x03\x04\x05\x06\x07\x08"
    + b"\x04"
    + b"\xc0"
    + b"\xa3GPU"
    # ["BlockRemoved", [BIG]]: the medium (nil) dropped as a trailing default
    + b"\x92\xacBlockRemoved\x91"
    + BIG_HASH_BYTES
    # ["AllBlocksCleared"]
    + b"\x91\xb0AllBlocksCleared"
    + b"\x00"  # data-parallel rank 0
)

# vLLM >= 0.24: events are maps with a "type"; default-valued fields are left out.
MAP_BATCH = (
    b"\x92"  # [ts, events]: an old release without the rank
    + FLOAT_1_5
    + b"\x92"
    # {"type": "BlockStored", "block_hashes": [sha], "parent_block_hash": nil,
    #  "token_ids": [9, 10], "block_size": 2, "medium": "CPU"}
    + b"\x86\xa4type\xabBlockStored"
    + b"\xacblock_hashes\x91\xc4\x20"
    + SHA
    + b"\xb1parent_block_hash\xc0"
    + b"\xa9token_ids\x92\x09\x0a"
    + b"\xaablock_size\x02"
    + b"\xa6medium\xa3CPU"
    # {"type": "BlockRemoved", "block_hashes": [sha], "medium": "CPU"}
    + b"\x83\xa4type\xacBlockRemoved"
    + b"\xacblock_hashes\x91\xc4\x20"
    + SHA
    + b"\xa6medium\xa3CPU"
)


def test_decode_array_encoding_int_hashes_exact() -> None:
    counts = Counts()
    batch = decode_batch(ARRAY_BATCH, counts)
    assert batch == Batch(
        1.5,
        (
            BlockStored((7, BIG_HASH), None, (1, 2, 3, 4, 5, 6, 7, 8), 4, None, "GPU"),
            BlockRemoved((BIG_HASH,)),
            AllBlocksCleared(),
        ),
        0,
    )
    assert counts.events == {"BlockStored": 1, "BlockRemoved": 1, "AllBlocksCleared": 1}
    assert counts.malformed == counts.unknown_events == counts.unknown_fields == 0


def test_decode_map_encoding_bytes_hashes_exact() -> None:
    counts = Counts()
    batch = decode_batch(MAP_BATCH, counts)
    assert batch == Batch(
        1.5,
        (
            BlockStored((SHA,), None, (9, 10), 2, medium="CPU"),
            BlockRemoved((SHA,), "CPU"),
        ),
        None,
    )
    assert counts.batches == 1 and counts.malformed == 0


def test_decode_unknown_field_and_event_are_counted_and_ignored() -> None:
    payload = (
        b"\x93\x01\x93"
        # {"type": "BlockRemoved", "block_hashes": [5], "future": true}
        + b"\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\x05\xa6future\xc3"
        # ["BlockRemoved", [6], nil, nil, 3]: two positional fields past the known ones
        + b"\x95\xacBlockRemoved\x91\x06\xc0\xc0\x03"
        # ["Teleported", 1]
        + b"\x92\xaaTeleported\x01"
        + b"\x00"
    )
    counts = Counts()
    batch = decode_batch(payload, counts)
    assert batch is not None
    assert batch.events == (BlockRemoved((5,)), BlockRemoved((6,)))
    assert counts.unknown_fields == 3 and counts.unknown_events == 1 and counts.malformed == 0


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(ARRAY_BATCH[:-7], id="truncated"),
        pytest.param(b"\x91\x01", id="batch-too-short"),
        pytest.param(b"\x92\xa1x\x90", id="timestamp-not-number"),
        pytest.param(b"\x92\x01\x05", id="events-not-array"),
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(b"\xdd\xff\xff\xff\xff", id="huge-array-header"),
    ],
)
def test_decode_bad_batch_dropped_and_counted(payload: bytes) -> None:
    counts = Counts()
    assert decode_batch(payload, counts) is None
    assert counts.malformed == 1 and counts.batches == 0


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(b"\x92\xacBlockRemoved\x91\xc4\x03abc", id="hash-of-3-bytes"),
        pytest.param(b"\x92\xacBlockRemoved\x91\xa1x", id="hash-a-string"),
        pytest.param(b"\x92\xacBlockRemoved\x05", id="hashes-not-array"),
        # 2 hashes but 3 tokens of block size 2: not whole blocks
        pytest.param(b"\x95\xabBlockStored\x92\x01\x02\xc0\x93\x01\x02\x03\x02", id="tokens"),
        pytest.param(b"\x94\xabBlockStored\x91\x01\xc0\x91\x01", id="missing-block-size"),
        pytest.param(b"\x95\xabBlockStored\x91\x01\xc0\x91\xff\x00", id="block-size-0"),
        pytest.param(b"\x95\xabBlockStored\x91\x01\xc0\x91\xd0\xff\x01", id="negative-token"),
        pytest.param(b"\x81\xa4type\xacBlockRemoved", id="map-missing-hashes"),
        pytest.param(b"\x05", id="not-an-event"),
    ],
)
def test_decode_bad_event_dropped_rest_kept(event: bytes) -> None:
    good = b"\x91\xb0AllBlocksCleared"
    counts = Counts()
    batch = decode_batch(b"\x92\x01\x92" + event + good, counts)
    assert batch is not None and batch.events == (AllBlocksCleared(),)
    assert counts.malformed == 1


def test_split_message_and_replay_framings() -> None:
    seq = (258).to_bytes(8, "big")
    assert split_message([b"kv", seq, b"p"]) == (b"kv", 258, b"p")
    assert split_replay([b"", seq, b"p"]) == (258, b"p")
    assert split_replay([b"", b"kv", seq, b"p"]) == (258, b"p")
    end = b"\xff" * 8
    assert split_replay([b"", end, b""]) is None
    assert split_replay([b"", b"", end, b""]) is None
    for bad in ([b"kv", b"\x01", b"p"], [b"kv", seq]):
        with pytest.raises(Malformed):
            split_message(bad)
    with pytest.raises(Malformed):
        split_replay([b"x", seq, b"p"])


# -- token-exact keys ------------------------------------------------------------------------


# -- fuzzing ---------------------------------------------------------------------------------

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.binary(max_size=40)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "medium"]),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(
            st.sampled_from(["type", "block_hashes", "token_ids", "block_size", "x"]), inner
        )
    ),
    max_leaves=30,
)


def _packs(v: Any) -> bool:
    try:
        msgpack.packb(v)
    except (OverflowError, ValueError, TypeError):
        return False
    return True


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_never_raise_always_count(data: bytes) -> None:
    counts = Counts()
    batch = decode_batch(data, counts)
    assert (batch is None) == (counts.malformed == 1 and counts.batches == 0)


@settings(max_examples=300)
@given(st.floats(allow_nan=False), st.lists(values, max_size=5))
def test_fuzz_structured_batches_never_raise_and_account_for_each_event(
    ts: float, events: list[Any]
) -> None:
    counts = Counts()
    payload = msgpack.packb([ts, events]) if _packs(events) else b"\xc1"
    batch = decode_batch(payload, counts)
    if batch is None:
        assert counts.malformed == 1
        return
    dropped = counts.malformed + counts.unknown_events
    assert len(batch.events) + dropped == len(events)
    eb = EngineBlocks(16)
    for e in batch.events:
        eb.apply(e)  # whatever decoded is safe to key
    assert len(eb) <= 16


def test_decode_map_without_nil_parent_reads_it_as_none() -> None:
    # {"type": "BlockStored", "block_hashes": [1], "token_ids": [4], "block_size": 1}
    event = b"\x84\xa4type\xabBlockStored\xacblock_hashes\x91\x01\xa9token_ids\x91\x04"
    event += b"\xaablock_size\x01"
    counts = Counts()
    batch = decode_batch(b"\x92\x01\x91" + event, counts)
    assert batch is not None and batch.events == (BlockStored((1,), None, (4,), 1),)


@pytest.mark.parametrize(
    ("ids", "ok"),
    [
        pytest.param([0, 5, (1 << 32) - 1], True, id="in_range"),
        pytest.param([], True, id="empty"),
        pytest.param([1, True], False, id="bool"),
        pytest.param([1, -1], False, id="negative"),
        pytest.param([1, 1 << 32], False, id="beyond_32_bits"),
        pytest.param([1, 2.0], False, id="float"),
        pytest.param([1, "2"], False, id="string"),
    ],
)
def test_token_array_packs_32_bit_ids_only(ids: list[Any], ok: bool) -> None:
    got = token_array(ids)
    assert (got is not None) == ok
    if got is not None:
        assert list(got) == ids and got.typecode == "I"
