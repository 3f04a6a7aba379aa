"""Precise overlaps: what engines that publish KV cache events hold, in the request's units.

Precise engines (``RoutingCore.set_precise``: their KV cache events arrive and are complete)
are asked in their own key space when the request's token ids are known (``TokenPrompt``):
the router's chained keys over the ids, cut at the engine's block size (``token_keys``),
against the entries the engine's events put in the index, weighted by medium. The event
overlap is scaled to the request's text blocks (the share of the prompt held), so scorers
compare every engine in one unit. Entries this router routed there in the last
``bridge_seconds`` bridge the time until the engine's event arrives; the larger of the two
counts, and each candidate's source says which it came from (``event``, ``predicted`` or
``none``). Engines without events, a degraded feed, or a request whose tokens are unknown
use the text keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.core.blocks import CHARS_PER_TOKEN, token_keys
from router.core.index import BlockIndex

# Medium tiers: a block in CPU memory or on disk still saves prefill, but costs a load.
DEFAULT_MEDIUM_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.5, "disk": 0.25}
# How long a routed prefix counts on a precise engine before its own event must confirm it:
# events arrive within milliseconds; a prefix still unconfirmed after this was not cached.
DEFAULT_BRIDGE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A request's token ids as the engines' tokenizer gives them, and its LoRA adapter.

    ``text_chars``: the length of routing text the ids stand for (characters; for a prompt of
    ids, ids times ``CHARS_PER_TOKEN``), to turn tokens an engine holds into the request's
    text blocks. When the ids are only a head of the prompt (an earlier turn of the
    conversation, tokenized before), it is that head's length. None: the ids are the whole
    prompt, and its text blocks are spread evenly over them.
    """

    token_ids: Sequence[int]
    lora_name: str | None = None
    text_chars: int | None = None

    def prompt_tokens(self, chars: int) -> int:
        """The prompt's length in tokens, for a routing text of ``chars`` characters: the ids,
        and for the text past a head the ids stand for, the characters-per-token guess."""
        rest = 0 if self.text_chars is None else max(0, chars - self.text_chars)
        return len(self.token_ids) + rest // CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class PreciseSettings:
    """How precise overlaps are weighed: per medium, and the bridge until an event arrives."""

    medium_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_MEDIUM_WEIGHTS)
    bridge_seconds: float = DEFAULT_BRIDGE_SECONDS

    def weight(self, medium: str) -> float:
        """The weight of a block held in ``medium`` (an unknown medium: the lowest)."""
        w = self.medium_weights
        return w.get(medium, min(w.values(), default=0.0))


def precise_overlaps(
    index: BlockIndex,
    sizes: Mapping[str, int],
    settings: PreciseSettings,
    block_chars: int,
    keys: Sequence[int],
    tokenized: TokenPrompt,
    cands: Sequence[str],
    now: float,
    overlaps: list[int],
    src: dict[str, str],
) -> None:
    """Replace each precise candidate's overlap (``sizes``: engine -> its block size in
    tokens) with its events' or the bridge's, and say which in ``src``."""
    by_size: dict[int, list[int]] = {}
    for i, e in enumerate(cands):
        size = sizes.get(e)
        if size is None:
            continue
        pk = by_size.get(size)
        if pk is None:
            pk = by_size[size] = token_keys(tokenized.token_ids, size, tokenized.lora_name)
        _, weighted = index.event_overlap(e, pk, settings.weight)
        held = text_blocks(weighted * size, tokenized, len(keys), block_chars)
        bridge = 0
        if overlaps[i]:
            bridge = index.leading_since(e, keys, now - settings.bridge_seconds)
        if bridge > held:
            overlaps[i], src[e] = bridge, "predicted"
        else:
            overlaps[i], src[e] = held, "event" if held else "none"


def text_blocks(tokens: float, tokenized: TokenPrompt, blocks: int, block_chars: int) -> int:
    """Held ``tokens`` of the prompt as its leading text blocks (what scorers count)."""
    ids = len(tokenized.token_ids)
    if not ids:
        return 0
    chars = tokenized.text_chars
    if chars is None:
        return min(blocks, int(tokens * blocks / ids + 1e-9))
    # Through characters: the ids cover ``chars`` of text, whole blocks or not, so a held
    # head of whole blocks is never cut short by the text's partial last block.
    return min(blocks, int(tokens * chars / ids / block_chars + 1e-9))
