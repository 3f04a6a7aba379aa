"""One engine's KV cache events -> changes to its entries in the index, in router keys.

``EngineBlocks`` keys every stored block the router's way (*token-exact keys*,
``core.blocks.token_keys``: the router's own chained xxh3_64 over the block's token ids,
never a copy of the engine's hash function) and remembers, bounded, which router key each
engine hash stands for, so removals and parent links resolve. A request's token ids keyed with
``token_keys`` at the engine's block size give the same keys, so the index answers it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]  # ships no type information
import xxhash

from router.core.blocks import chain_keys, token_blocks, token_seed
from router.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event, Hash

GPU = "gpu"


def _extra_digest(extra: Any) -> bytes:
    # Multimodal hashes or a cache salt make a block differ from text with the same tokens.
    packed = msgpack.packb(extra, use_bin_type=True)
    return xxhash.xxh3_64_digest(packed)


@dataclass(frozen=True, slots=True)
class Change:
    """What one event does to the engine's entries in the index, in router keys."""

    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    medium: str = GPU
    cleared: bool = False


def medium_of(value: str | None) -> str:
    """The tier a medium names, lower case; None is the GPU."""
    return GPU if not value else value.lower()


class EngineBlocks:
    """One engine's block hashes -> router keys, bounded; events -> index changes."""

    def __init__(self, max_hashes: int) -> None:
        self.max_hashes = max(1, max_hashes)
        self._keys: dict[Hash, int] = {}
        self.block_size: int | None = None
        self.orphans = 0  # stored blocks whose parent was unknown: not keyable, dropped

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        self._keys.clear()

    def key_of(self, block_hash: Hash) -> int | None:
        return self._keys.get(block_hash)

    def apply(self, event: Event) -> Change | None:
        """The index change ``event`` stands for (None: nothing to change)."""
        if isinstance(event, AllBlocksCleared):
            self._keys.clear()
            return Change(cleared=True)
        if event.group_idx:  # another KV-cache group of a hybrid model: not prefix blocks
            return None
        if isinstance(event, BlockRemoved):
            pop = self._keys.pop
            gone = [k for h in event.block_hashes if (k := pop(h, None)) is not None]
            return Change(removed=tuple(gone), medium=medium_of(event.medium))
        return self._stored(event)

    def _stored(self, e: BlockStored) -> Change | None:
        if e.parent_block_hash is None:
            seed = token_seed(e.lora_name)
        else:
            parent = self._keys.get(e.parent_block_hash)
            if parent is None:
                self.orphans += 1
                return None
            seed = parent
        self.block_size = e.block_size
        chunks: list[bytes] = token_blocks(e.token_ids, e.block_size)
        extra = e.extra_keys
        if extra:
            chunks = [
                c + _extra_digest(extra[i]) if i < len(extra) and extra[i] is not None else c
                for i, c in enumerate(chunks)
            ]
        keys = chain_keys(chunks, seed)
        d = self._keys
        hashes = e.block_hashes
        # Hashes stored again move to the end (the newest survive the cap); the rest are new.
        for h in d.keys() & set(hashes):
            del d[h]
        d.update(zip(hashes, keys, strict=True))
        if len(d) > self.max_hashes:
            for h in list(d)[: len(d) - self.max_hashes + self.max_hashes // 64]:
                del d[h]
        return Change(stored=tuple(keys), medium=medium_of(e.medium))
