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

With a model's tokenizer (``engine-sim --tokenizer PATH``), a text prompt is its ids instead,
as the router's local tokenizer computes them (``router.local_tokenizer``): the chat
template applied, then encoded. From there on it is a token-id prompt like any other. A prompt
the tokenizer cannot render (an image, no chat template) keeps its text pieces.

Generated text is ``CHARS_PER_TOKEN`` characters per output token (a space and a three-letter
word), so an answer sent back as the next turn's history counts as many tokens as were sent.
"""

from __future__ import annotations

import sys
from array import array

import xxhash

from router.core.blocks import CHARS_PER_TOKEN, RoutingText, block_keys
from router.gateway.openai.request import Inbound
from router.local_tokenizer import LocalTokenizer

# Output vocabulary: each entry is one output token of exactly CHARS_PER_TOKEN characters.
# Seventeen entries, a prime, so the output of different prompts and choices differs.
_SENTENCE = "the sly red fox ran far and one old owl saw him hop off the wet log"
OUTPUT_TOKENS = tuple(" " + word for word in _SENTENCE.split())


def prompt_text(inbound: Inbound, tokenizer: LocalTokenizer | None) -> RoutingText:
    """What the engine counts of a request: its routing text, or the tokenizer's ids for it."""
    rt = inbound.text
    if tokenizer is None or rt.token_ids is not None:
        return rt
    try:
        ids = tokenizer.ids(inbound.prompt_body)
    except ValueError:
        return rt
    return RoutingText(rt.namespace, token_ids=array("I", ids))


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
# Ids of 4-byte pieces already computed (a pure function, memoised): a conversation's next turn
# repeats its history, so most pieces were seen before. Cleared when it grows past this.
_PIECE_IDS: dict[int, int] = {}
PIECE_MEMO_LIMIT = 1 << 20


def _piece_id(piece: bytes) -> int:
    return xxhash.xxh3_64_intdigest(piece) % VOCABULARY


def _ascii_ids(data: bytes) -> list[int]:
    # An ASCII piece is 4 bytes: one machine word, so the pieces are cut in C, and each
    # distinct word is hashed once (then looked up in C): a long prompt costs a few ms, not
    # one Python call per token.
    words = array("I")
    words.frombytes(data[: len(data) - len(data) % 4])
    memo = _PIECE_IDS
    new = set(words).difference(memo)
    if new:
        if len(memo) + len(new) > PIECE_MEMO_LIMIT:
            memo.clear()
            new = set(words)
        order = sys.byteorder
        for w in new:
            memo[w] = _piece_id(w.to_bytes(4, order))
    return list(map(memo.__getitem__, words))


def token_ids(rt: RoutingText, start: int = 0, end: int | None = None) -> list[int]:
    """The prompt's token ids ``start`` to ``end``: its ids, or one id per
    ``CHARS_PER_TOKEN``-character piece (the hash of the piece's UTF-8 bytes).

    What ``POST /tokenize`` answers and what the KV events carry, so that the router's keys
    over these ids name the blocks the cache holds (a trailing partial piece is no token, as
    ``prompt_tokens`` counts it).
    """
    if rt.token_ids is not None:
        return list(rt.token_ids[start:end])
    text = rt.text or ""
    n = len(text) // CHARS_PER_TOKEN
    stop = n if end is None else min(end, n)
    if start >= stop:
        return []
    part = text[start * CHARS_PER_TOKEN : stop * CHARS_PER_TOKEN]
    if part.isascii():
        return _ascii_ids(part.encode("ascii"))
    return [
        _piece_id(part[i : i + CHARS_PER_TOKEN].encode("utf-8", "surrogatepass"))
        for i in range(0, len(part), CHARS_PER_TOKEN)
    ]


def output_token(seed: int, i: int, choice: int) -> str:
    """Output token ``i`` of ``choice`` for a prompt whose last key (or length) is ``seed``."""
    return OUTPUT_TOKENS[(seed + 7 * i + 11 * choice) % len(OUTPUT_TOKENS)]
