"""Conversations' previous turns: where a follow-up turn's prefix broke from the last one's.

A conversation's next turn repeats the previous turn's prompt and adds to it, so its chained
block keys start with the previous turn's keys. ``Turns`` remembers, per conversation (a
session key), only the previous answered turn's block count ``n`` and its last key: because
keys are chained, the new turn's key at block ``n - 1`` equals that last key exactly when
the whole previous prompt is repeated. When it differs, something earlier was rewritten (a
reasoning block dropped from history, a date line in the system prompt), and the turn is
flagged at the depth the index still holds: the first block nobody holds, which is the
rewritten block while the blocks before it stay cached.

A key costs about 150 bytes (a 32-character session key, a tuple, the dict slot), so the
default bound of 65,536 conversations keeps it under 10 MB; the least recent go first.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_MAX_CONVERSATIONS = 65_536


class Turns:
    """Per conversation, the block count and last key of its previous answered turn."""

    def __init__(self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        self.max_conversations = max_conversations
        self._last: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def broken_at(self, conversation: str | None, keys: Sequence[int], held: int) -> int | None:
        """The block where this turn's prefix left the previous turn's (None: it did not,
        or no previous turn is known); ``held``: the leading blocks some engine holds."""
        if conversation is None:
            return None
        prev = self._last.get(conversation)
        if prev is None:
            return None
        n, last = prev
        if len(keys) >= n and keys[n - 1] == last:
            return None
        # The break is before block n; the index says where, as far as it still holds.
        return min(held, n - 1)

    def remember(self, conversation: str, keys: Sequence[int]) -> None:
        """``conversation``'s latest answered turn had these block keys."""
        last = self._last
        last.pop(conversation, None)
        if not keys:
            return
        last[conversation] = (len(keys), keys[-1])
        if len(last) > self.max_conversations:
            del last[next(iter(last))]
