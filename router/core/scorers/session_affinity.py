"""session-affinity: the engine that served a session's previous request scores 1.

The scorer owns everything a session is: which request belongs to which session
(``session_of``, below), and the bounded map of where each session's last answered request
went (``Sessions``). The router core only carries the key from the decision to the answer.

A request names its session by the first of these that it carries (a value is a non-empty
string; every key is a fixed-size digest of it):

1. the policy's ``header`` (default ``x-session-id``, also what OpenRouter and opencode send),
   then each of its ``headers``, in their order;
2. with ``agent_ids`` (default on), the ids coding agents and gateways send of themselves
   (``AGENT_HEADERS``, then ``AGENT_FIELDS``): Claude Code's ``x-claude-code-session-id`` and
   the session inside its ``metadata.user_id``; the Codex CLI's ``session_id`` header; the
   body's ``prompt_cache_key`` (OpenAI's Responses and Chat APIs; Codex sets it to its
   conversation id), ``conversation`` (Responses), ``session_id`` (OpenRouter) and
   ``litellm_session_id`` (LiteLLM);
3. with ``user_field`` (default on), the body's ``user`` (OpenAI), else Anthropic's
   ``metadata.user_id`` as it is: these name a user, who may hold several conversations.

Names the operator gives come first, so a fleet's own header always wins over what a client
claims of itself; user ids come last, being the coarsest.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from router.core.fields import Fields
from router.core.scorers.base import Inputs, ScorerType, param, read_params

NAME = "session-affinity"

# Session headers that agent clients and gateways send on every request of one conversation.
AGENT_HEADERS = (
    "x-claude-code-session-id",  # Claude Code, from v2.1.86
    "session_id",  # the OpenAI Codex CLI: its conversation id
    "session-id",  # Codex CLI builds that spell it with a hyphen
    "x-opencode-session",  # what OpenCode's gateway asks its clients for
)
# Top-level body fields naming a conversation, in the order they are read.
AGENT_FIELDS = ("prompt_cache_key", "conversation", "session_id", "litellm_session_id")
# Claude Code's metadata.user_id: a JSON object with a "session_id", or (before v2.1.86)
# "user_<hash>_account_<uuid>_session_<uuid>".
_LEGACY_CLAUDE_SESSION = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")
# Claude Code's object is a few hundred bytes; a longer one is read as a plain user id.
MAX_USER_ID_JSON = 1024
# A header name as HTTP defines one (a token), and how many extra ones a policy may list.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]{1,64}")
MAX_HEADERS = 16


@dataclass(frozen=True, slots=True)
class Params:
    """``header``: the request header naming the session (lower case); ``headers``: more
    such headers, read next in their order; ``agent_ids``: then the ids agents send of
    themselves; ``user_field``: else the body's user id; ``max_sessions``: sessions
    remembered, least recent forgotten first."""

    header: str = param("x-session-id")
    headers: tuple[str, ...] = param((), 0, MAX_HEADERS)
    agent_ids: bool = param(True)
    user_field: bool = param(True)
    max_sessions: int = param(100_000, 1, 10_000_000)


def parse(f: Fields) -> Params:
    """The params of a ``session-affinity`` entry (header names compare in lower case)."""
    p = read_params(Params, f)
    headers = tuple(h.lower() for h in p.headers)
    for i, h in enumerate(headers):
        if not _HEADER_NAME.fullmatch(h):
            f.fail(f"{f.at('headers')}[{i}]", f"must be an HTTP header name, got {h!r}")
    return dataclasses.replace(p, header=p.header.lower(), headers=headers)


def score(_p: Params, x: Inputs) -> list[float]:
    """1 for the engine that served this session's previous request."""
    e = x.session_engine
    return [1.0 if c == e else 0.0 for c in x.candidates]


def session_key(value: str) -> str:
    """A session's key: 32 hex digits of xxh3_128, whatever the length of ``value``."""
    return xxhash.xxh3_128_hexdigest(value.encode("utf-8", "surrogatepass"))


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _metadata_user(body: Mapping[str, Any]) -> str | None:
    meta = body.get("metadata")
    return _text(meta.get("user_id")) if isinstance(meta, Mapping) else None


def claude_session(user_id: str) -> str | None:
    """The session Claude Code writes into Anthropic's ``metadata.user_id``, if it is one."""
    if user_id.startswith("{"):
        if len(user_id) > MAX_USER_ID_JSON:
            return None
        try:
            parsed = json.loads(user_id)
        except (ValueError, RecursionError):
            return None
        return _text(parsed.get("session_id")) if isinstance(parsed, dict) else None
    m = _LEGACY_CLAUDE_SESSION.search(user_id)
    return m.group(1) if m else None


def _agent_field(body: Mapping[str, Any]) -> str | None:
    user_id = _metadata_user(body)
    if user_id is not None and (sid := claude_session(user_id)) is not None:
        return sid
    for name in AGENT_FIELDS:
        v = body.get(name)
        if name == "conversation" and isinstance(v, Mapping):  # Responses: {"id": "conv_..."}
            v = v.get("id")
        if (text := _text(v)) is not None:
            return text
    return None


def session_value(p: Params, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """What names the request's session, by the module's order of precedence (None: none)."""
    names = (p.header, *p.headers) if p.header else p.headers
    if p.agent_ids:
        names += AGENT_HEADERS
    for name in names:
        if value := headers.get(name):
            return value
    if p.agent_ids and (value := _agent_field(body)) is not None:
        return value
    if p.user_field:
        return _text(body.get("user")) or _metadata_user(body)
    return None


def session_of(p: Params, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The session key for affinity (``session_value``'s digest), or None."""
    value = session_value(p, headers, body)
    return None if value is None else session_key(value)


def session_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The nested body fields ``session_of`` reads, cut to what it reads (for a body that
    keeps only its top-level scalars)."""
    out: dict[str, Any] = {}
    if (user_id := _metadata_user(body)) is not None:
        out["metadata"] = {"user_id": user_id}
    conv = body.get("conversation")
    if isinstance(conv, Mapping) and (cid := _text(conv.get("id"))) is not None:
        out["conversation"] = {"id": cid}
    return out


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
