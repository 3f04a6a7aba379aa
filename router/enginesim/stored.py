"""The responses engine-sim stored, for Responses requests that continue one.

A Responses request naming ``previous_response_id`` continues that response's conversation:
the engine puts the stored turns (the earlier input and the answer) before the new input, as
an engine with a response store does, so the prompt it computes, and its prefix-cache hits,
are the whole conversation's. Every response is stored (``store`` defaults to true), in a
bounded, least recently used first out map; an id it does not hold is a 404 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.core.blocks import routing_text
from router.gateway.openai.errors import NotFound
from router.gateway.openai.request import Inbound

# Conversations kept; each is its turns in the chat form (a few KB for an agent's history).
STORED_RESPONSES = 10_000
FIELD = "previous_response_id"


class ResponseStore:
    """Response id -> its conversation's turns in the chat form, the answer last."""

    __slots__ = ("_turns", "capacity")

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._turns: dict[str, tuple[Mapping[str, Any], ...]] = {}

    def __len__(self) -> int:
        return len(self._turns)

    def continued(self, inbound: Inbound) -> Inbound:
        """``inbound`` with the turns of the response it continues before its own."""
        previous = inbound.body.get(FIELD)
        if previous is None or inbound.chat is None:
            return inbound
        turns = self._turns.pop(previous, None) if isinstance(previous, str) else None
        if turns is None:
            raise NotFound(f"Response with id '{previous}' not found.", FIELD)
        self._turns[previous] = turns
        chat = {**inbound.chat, "messages": [*turns, *inbound.chat["messages"]]}
        return Inbound(inbound.body, routing_text(chat), inbound.model, inbound.stream, chat)

    def keep(self, response_id: str, turns: Sequence[Mapping[str, Any]], answer: str) -> None:
        """Store response ``response_id``: the conversation ``turns`` and its ``answer``."""
        self._turns[response_id] = (*turns, {"role": "assistant", "content": answer})
        if len(self._turns) > self.capacity:
            del self._turns[next(iter(self._turns))]

    def clear(self) -> None:
        self._turns.clear()
