"""session-affinity: the engine that served a session's previous request scores 1.

The scorer owns everything a session is: which request belongs to which session
(``key_of``: the policy's header, else the body's ``user``, as a fixed-size digest), and the
bounded map of where each session's last answered request went (``Sessions``). The router
core only carries the key from the decision to the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from router.core.fields import Fields
from router.core.scorers.base import Inputs, ScorerType, param, read_params

NAME = "session-affinity"


@dataclass(frozen=True, slots=True)
class Params:
    """``header``: the request header naming the session (lower case); ``user_field``: else
    the body's ``user``; ``max_sessions``: sessions remembered, least recent forgotten first."""

    header: str = param("x-session-id")
    user_field: bool = param(True)
    max_sessions: int = param(100_000, 1, 10_000_000)


def parse(f: Fields) -> Params:
    """The params of a ``session-affinity`` entry (header names compare in lower case)."""
    p = read_params(Params, f)
    return dataclasses.replace(p, header=p.header.lower())


def score(_p: Params, x: Inputs) -> list[float]:
    """1 for the engine that served this session's previous request."""
    e = x.session_engine
    return [1.0 if c == e else 0.0 for c in x.candidates]


def session_key(value: str) -> str:
    """A session's key: 32 hex digits of xxh3_128, whatever the length of ``value``."""
    return xxhash.xxh3_128_hexdigest(value.encode("utf-8", "surrogatepass"))


def session_of(p: Params, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The session key for affinity, of ``p.header``, else of the body's ``user``."""
    if p.header:
        value = headers.get(p.header)
        if value:
            return session_key(value)
    if p.user_field:
        user = body.get("user")
        if isinstance(user, str) and user:
            return session_key(user)
    return None


class Sessions:
    """Where each session's last answered request went; at most ``max_sessions`` of them."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self._engines: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._engines)

    def update(self, params: Params) -> None:
        """Go on with a reloaded policy's params; a smaller bound applies as sessions arrive."""
        self.params = params

    def key_of(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
        """The session key of a request (None: it names no session)."""
        return session_of(self.params, headers, body)

    def recall(self, key: str) -> str | None:
        """The engine that answered session ``key`` last, if remembered."""
        return self._engines.get(key)

    def remember(self, key: str, engine: str) -> None:
        """Session ``key``'s latest request was answered by ``engine``."""
        engines = self._engines
        engines.pop(key, None)
        engines[key] = engine
        if len(engines) > self.params.max_sessions:
            del engines[next(iter(engines))]


TYPE = ScorerType(NAME, Params, parse, score, memory=Sessions)
