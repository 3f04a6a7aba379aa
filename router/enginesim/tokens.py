"""How engine-sim counts tokens: in the router's unit, so both sides mean the same prompt.

A text prompt's tokens are ``CHARS_PER_TOKEN``-character pieces of its canonical routing text
(``router.core.blocks.routing_text``, the text the router hashes); a token-id prompt's tokens
are its ids. The count is the router's own estimate (``RoutingText.approx_tokens``, at least
one), which is also what the offline simulator charges, so a capacity, a prefill rate or a load
in tokens means the same thing to the router, the simulator and engine-sim.

A cache block is ``block_tokens`` tokens: ``block_tokens * CHARS_PER_TOKEN`` characters, keyed
by the router's own chained hash (``router.core.blocks.block_keys``). An engine whose block is a
whole fraction of the policy's ``block_chars`` (16 tokens against 512 characters) ends a block
wherever the router does, and with equal sizes its keys are the router's keys.

Generated text is ``CHARS_PER_TOKEN`` characters per output token (a space and a three-letter
word), so an answer sent back as the next turn's history counts as many tokens as were sent.
"""

from __future__ import annotations

import xxhash

from router.core.blocks import CHARS_PER_TOKEN, RoutingText, block_keys

# Output vocabulary: each entry is one output token of exactly CHARS_PER_TOKEN characters.
# Seventeen entries, a prime, so the output of different prompts and choices differs.
_SENTENCE = "the sly red fox ran far and one old owl saw him hop off the wet log"
OUTPUT_TOKENS = tuple(" " + word for word in _SENTENCE.split())


def prompt_tokens(rt: RoutingText) -> int:
    """The tokens a prompt counts: its ids, else its characters over ``CHARS_PER_TOKEN``."""
    return max(1, rt.approx_tokens)


def text_tokens(text: str) -> int:
    """The tokens a piece of plain text counts (an embedding input), at least one."""
    return max(1, len(text) // CHARS_PER_TOKEN)


def prefix_keys(rt: RoutingText, block_tokens: int) -> list[int]:
    """Chained keys of the prompt's full blocks of ``block_tokens`` tokens."""
    return block_keys(rt, block_tokens * CHARS_PER_TOKEN)


# Token ids of text pieces stay below this, like a real vocabulary's.
VOCABULARY = 1 << 31


def token_ids(rt: RoutingText) -> list[int]:
    """The prompt's token ids: its ids, or one id per ``CHARS_PER_TOKEN``-character piece.

    What ``POST /tokenize`` answers and what the KV events carry, so that the router's keys
    over these ids name the blocks the cache holds (a trailing partial piece is no token, as
    ``prompt_tokens`` counts it).
    """
    if rt.token_ids is not None:
        return list(rt.token_ids)
    text = rt.text or ""
    digest = xxhash.xxh3_64_intdigest
    return [
        digest(text[i : i + CHARS_PER_TOKEN].encode("utf-8", "surrogatepass")) % VOCABULARY
        for i in range(0, len(text) - CHARS_PER_TOKEN + 1, CHARS_PER_TOKEN)
    ]


def output_token(seed: int, i: int, choice: int) -> str:
    """Output token ``i`` of ``choice`` for a prompt whose last key (or length) is ``seed``."""
    return OUTPUT_TOKENS[(seed + 7 * i + 11 * choice) % len(OUTPUT_TOKENS)]
