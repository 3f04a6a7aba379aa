"""How engine-sim counts tokens: the whitespace-separated words of the prompt.

A text prompt's tokens are the words of its canonical routing text
(``router.core.blocks.routing_text``, the text the router hashes); a token-id prompt's tokens
are its ids. Full blocks of ``block_tokens`` tokens get chained keys seeded by the model
namespace. Generated text is one plain word per output token, so it re-tokenises to the same
count.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.core.blocks import RoutingText, chain_keys, namespace_seed

# Output vocabulary: plain words, so generated text re-tokenises to the same count.
_SENTENCE = (
    "the quick brown fox jumps over a lazy dog while seven bright stars watch from far above "
    "and every small river runs toward one quiet sea under an old silver moon"
)
OUTPUT_TOKENS = tuple(_SENTENCE.split())


def _words(rt: RoutingText) -> list[str]:
    if rt.token_ids is not None:
        return [str(t) for t in rt.token_ids]
    return (rt.text or "").split()


def prompt_tokens(rt: RoutingText) -> int:
    """The tokens a prompt counts: its words, or its token ids."""
    return len(_words(rt))


def text_tokens(text: str) -> int:
    """The tokens a piece of plain text counts (an embedding input)."""
    return len(text.split())


def prefix_keys(rt: RoutingText, block_tokens: int) -> list[int]:
    """Chained keys of the prompt's full blocks of ``block_tokens`` tokens."""
    tokens: Sequence[str] = _words(rt)
    full = len(tokens) - len(tokens) % block_tokens
    blocks = (
        " ".join(tokens[i : i + block_tokens]).encode("utf-8", "surrogatepass")
        for i in range(0, full, block_tokens)
    )
    return chain_keys(blocks, namespace_seed(rt.namespace))


def output_token(seed: int, i: int, choice: int) -> str:
    """Output token ``i`` of ``choice``: a word, space-led after the first."""
    w = OUTPUT_TOKENS[(seed + 7 * i + 11 * choice) % len(OUTPUT_TOKENS)]
    return w if i == 0 else " " + w
