"""One engine's events -> index changes in token-exact keys: chains, removals, bounds."""

from __future__ import annotations

from typing import Any

from router.core.blocks import token_keys
from router.core.engine_blocks import EngineBlocks
from router.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

SHA = bytes(range(32))


def stored(hashes: list[Any], parent: Any, tokens: list[int], size: int = 2, **kw: Any) -> Any:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size, **kw)


def test_keys_from_events_equal_keys_of_the_request_tokens() -> None:
    eb = EngineBlocks(100)
    first = eb.apply(stored([11, 12], None, [1, 2, 3, 4]))
    # A later step continues the sequence: the parent link carries the chain on.
    second = eb.apply(stored([13], 12, [5, 6]))
    assert first is not None and second is not None
    assert list(first.stored + second.stored) == token_keys([1, 2, 3, 4, 5, 6, 7], 2)
    assert eb.key_of(13) == token_keys([1, 2, 3, 4, 5, 6], 2)[2]
    # Another block size or another adapter is another key space.
    assert token_keys([1, 2, 3, 4], 4)[0] not in first.stored
    assert token_keys([1, 2], 2, "adapter")[0] != first.stored[0]


def test_keys_removed_by_engine_hash_and_orphans_counted() -> None:
    eb = EngineBlocks(100)
    got = eb.apply(stored([SHA], None, [1, 2], medium="CPU"))
    assert got is not None and got.medium == "cpu"
    removed = eb.apply(BlockRemoved((SHA, b"\x00" * 32)))
    assert removed is not None and removed.removed == got.stored and removed.medium == "gpu"
    assert eb.apply(stored([99], 12345, [1, 2])) is None and eb.orphans == 1
    assert eb.apply(AllBlocksCleared()) is not None and len(eb) == 0


def test_keys_extra_keys_make_blocks_differ() -> None:
    eb = EngineBlocks(100)
    plain = token_keys([1, 2, 3, 4], 2)
    got = eb.apply(stored([1, 2], None, [1, 2, 3, 4], extra_keys=(None, ["mm-hash"])))
    assert got is not None and got.stored[0] == plain[0] and got.stored[1] != plain[1]


def test_keys_other_kv_group_ignored() -> None:
    eb = EngineBlocks(100)
    assert eb.apply(stored([1], None, [1, 2], group_idx=1)) is None and len(eb) == 0


def test_hash_map_bounded() -> None:
    eb = EngineBlocks(64)
    for i in range(1000):
        eb.apply(stored([i], None, [i, i]))
    assert len(eb) <= 64 and eb.key_of(999) is not None and eb.key_of(0) is None
