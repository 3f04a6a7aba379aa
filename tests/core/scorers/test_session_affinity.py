"""session-affinity: how a request names its session, and the bounded map of where it went."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.decision import RoutingCore
from router.core.policy import PolicyError, load_policy_text
from router.core.scorers.session_affinity import (
    Params,
    Sessions,
    session_fields,
    session_key,
    session_of,
    session_value,
)

HEADER = "x-session-id"
ENGINES = ["a", "b", "c"]


def body(user: str | None = None) -> dict[str, Any]:
    return (
        {"model": "m", "prompt": "x"}
        if user is None
        else {"model": "m", "prompt": "x", "user": user}
    )


def test_session_header_first_then_user_field() -> None:
    b = body("alice")
    assert session_of(Params(), {HEADER: "s1"}, b) == session_key("s1")
    assert session_of(Params(), {}, b) == session_key("alice")
    assert session_of(Params(user_field=False), {}, b) is None


@pytest.mark.parametrize(
    "value",
    ["alice", "x" * (4 * 1024 * 1024), "\udcff not UTF-8 in a header", "\U0001f600" * 1000],
    ids=["short", "4MB", "surrogate-escape", "astral"],
)
def test_session_key_fixed_size_whatever_the_value(value: str) -> None:
    key = session_key(value)
    assert len(key) == 32 and int(key, 16) >= 0
    assert key == session_key(value)  # the same session gets the same key on every replica
    assert key != session_key(value + "!")


def test_session_of_long_user_kept_as_digest() -> None:
    user = "u" * (1024 * 1024)
    for got in (
        session_of(Params(), {}, body(user)),
        session_of(Params(), {HEADER: user}, body(user)),
    ):
        assert got == session_key(user) and len(got) == 32


def test_sessions_bounded_least_recent_forgotten_first() -> None:
    s = Sessions(Params(max_sessions=2))
    s.remember("s1", "a")
    s.remember("s2", "b")
    s.remember("s1", "c")  # s1 is the most recent again
    s.remember("s3", "a")
    assert len(s) == 2 and s.recall("s2") is None
    assert (s.recall("s1"), s.recall("s3")) == ("c", "a")


def test_policy_header_read_in_lower_case() -> None:
    text = "name: t\nscorers: [{type: session-affinity, weight: 1, header: X-Conversation}]\n"
    r = RoutingCore(load_policy_text(text, "t"))
    assert r.session_of({"x-conversation": "c1"}, body()) == session_key("c1")


def test_core_without_session_affinity_names_the_default_session_and_recalls_none() -> None:
    r = RoutingCore(load_policy_text("name: t\nscorers: [{type: load, weight: 1}]\n", "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    session = r.session_of({HEADER: "s1"}, body("alice"))
    assert session == session_key("s1")
    r.record(r.acquire(r.decide(body(), ENGINES, 0.0, session), "b", 0.0), 0.0)
    assert r.decide(body(), ENGINES, 0.0, session).inputs.session_engine is None


def test_core_reload_keeps_sessions_and_takes_the_new_bound() -> None:
    text = "name: t\nscorers: [{{type: session-affinity, weight: 1, max_sessions: {n}}}]\n"
    r = RoutingCore(load_policy_text(text.format(n=10), "t"))
    r.set_engines(dict.fromkeys(ENGINES, 1))
    d = r.decide(body(), ENGINES, 0.0, r.session_of({HEADER: "s1"}, body()))
    lease = r.acquire(d, "b", 0.0)
    r.record(lease, 0.0)
    r.release(lease)
    r.set_policy(load_policy_text(text.format(n=1), "t"))
    again = r.decide(body(), ENGINES, 1.0, r.session_of({HEADER: "s1"}, body()))
    assert again.inputs.session_engine == "b" and again.engine == "b"
    r.set_policy(load_policy_text("name: t\nscorers: [{type: load, weight: 1}]\n", "t"))
    assert r.decide(body(), ENGINES, 2.0, session_key("s1")).inputs.session_engine is None


# -- what agents and gateways send -------------------------------------------------------------

CLAUDE_JSON = '{"device_id":"d1","account_uuid":"","session_id":"54c1eb09-bc4c-4d2f"}'
CLAUDE_LEGACY = "user_0a1b_account_7c_session_57a121ec-f78c-48c3-a745-e3036a3ecc33"


@pytest.mark.parametrize(
    ("headers", "fields", "named"),
    [
        ({"x-claude-code-session-id": "cc1"}, {}, "cc1"),
        ({"session_id": "codex1"}, {}, "codex1"),
        ({"session-id": "codex2"}, {}, "codex2"),
        ({"x-opencode-session": "oc1"}, {}, "oc1"),
        ({}, {"metadata": {"user_id": CLAUDE_JSON}}, "54c1eb09-bc4c-4d2f"),
        ({}, {"metadata": {"user_id": CLAUDE_LEGACY}}, "57a121ec-f78c-48c3-a745-e3036a3ecc33"),
        ({}, {"prompt_cache_key": "pck1"}, "pck1"),
        ({}, {"conversation": "conv_1"}, "conv_1"),
        ({}, {"conversation": {"id": "conv_2"}}, "conv_2"),
        ({}, {"session_id": "or1"}, "or1"),
        ({}, {"litellm_session_id": "ll1"}, "ll1"),
        ({}, {"metadata": {"user_id": "plain-user"}}, "plain-user"),
        ({}, {"user": "alice"}, "alice"),
    ],
    ids=[
        "claude-code-header",
        "codex-session_id-header",
        "codex-session-id-header",
        "opencode-header",
        "claude-code-metadata-json",
        "claude-code-metadata-legacy",
        "prompt-cache-key",
        "responses-conversation-id",
        "responses-conversation-object",
        "openrouter-session-id",
        "litellm-session-id",
        "anthropic-metadata-user",
        "openai-user",
    ],
)
def test_session_named_by_each_source(
    headers: dict[str, str], fields: dict[str, Any], named: str
) -> None:
    b = {**body(), **fields}
    assert session_value(Params(), headers, b) == named
    assert session_of(Params(), headers, b) == session_key(named)


def test_session_sources_in_order_of_precedence() -> None:
    """Operator's header, extra headers, agent headers, agent fields, then user ids."""
    p = Params(headers=("x-thread", "x-conv"))
    headers = {
        "x-session-id": "h0",
        "x-thread": "h1",
        "x-conv": "h2",
        "x-claude-code-session-id": "a1",
        "session_id": "a2",
    }
    b = {
        **body("alice"),
        "metadata": {"user_id": CLAUDE_JSON},
        "prompt_cache_key": "f2",
        "conversation": "f3",
    }
    order = ["h0", "h1", "h2", "a1", "a2", "54c1eb09-bc4c-4d2f", "f2", "f3", "alice"]
    header_of = {v: k for k, v in headers.items()}
    for expected in order:
        assert session_value(p, headers, b) == expected
        if expected in header_of:
            del headers[header_of[expected]]
        elif expected == "54c1eb09-bc4c-4d2f":
            b["metadata"] = {"user_id": "plain"}  # a user id, read only after the fields
        else:
            b = {k: v for k, v in b.items() if v != expected}
    assert session_value(p, headers, b) == "plain"


def test_session_agent_ids_off_reads_only_operator_headers_and_users() -> None:
    p = Params(agent_ids=False)
    agent = {"x-claude-code-session-id": "cc1"}
    assert session_value(p, agent, {**body(), "prompt_cache_key": "k"}) is None
    assert session_value(p, agent, {**body(), "metadata": {"user_id": CLAUDE_JSON}}) == CLAUDE_JSON
    assert session_value(Params(agent_ids=False, user_field=False), agent, body("a")) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_cache_key": ""},
        {"prompt_cache_key": 7},
        {"conversation": {"id": 3}},
        {"conversation": []},
        {"metadata": "not an object"},
        {"metadata": {"user_id": None}},
        {"metadata": {"user_id": "{" + "[" * 5000}},
        {"metadata": {"user_id": '{"session_id": 5}'}},
        {"metadata": {"user_id": "[1, 2]"}},
    ],
    ids=[
        "empty",
        "number",
        "conversation-id-number",
        "conversation-list",
        "metadata-text",
        "user-id-null",
        "user-id-deep-json",
        "session-id-number",
        "user-id-json-list",
    ],
)
def test_session_malformed_ids_name_no_session_and_never_raise(fields: dict[str, Any]) -> None:
    p = Params(user_field=False)
    assert session_value(p, {}, {**body(), **fields}) is None


def test_session_fields_keep_only_what_affinity_reads() -> None:
    b = {
        **body(),
        "metadata": {"user_id": CLAUDE_JSON, "other": "x" * 1000},
        "conversation": {"id": "c1", "items": [1, 2, 3]},
    }
    kept = session_fields(b)
    assert kept == {"metadata": {"user_id": CLAUDE_JSON}, "conversation": {"id": "c1"}}
    assert session_value(Params(), {}, kept) == session_value(Params(), {}, b)


def test_policy_extra_headers_read_in_lower_case_and_checked() -> None:
    text = "name: t\nscorers: [{type: session-affinity, weight: 1, headers: [X-Thread-Id]}]\n"
    r = RoutingCore(load_policy_text(text, "t"))
    assert r.session_of({"x-thread-id": "t1"}, body()) == session_key("t1")
    for bad, reason in [
        ("headers: [x y]", "headers[0]: must be an HTTP header name"),
        ("headers: x-one", "headers: must be a list of strings"),
        (f"headers: [{', '.join(f'h{i}' for i in range(17))}]", "from 0 to 16 strings"),
    ]:
        with pytest.raises(PolicyError, match=re.escape(reason)):
            load_policy_text(
                f"name: t\nscorers: [{{type: session-affinity, weight: 1, {bad}}}]\n", "t"
            )


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_fields = st.sampled_from(
    ["user", "metadata", "prompt_cache_key", "conversation", "session_id", "litellm_session_id"]
)


@given(
    headers=st.dictionaries(
        st.sampled_from(["x-session-id", "session_id", "x-claude-code-session-id", "x"]),
        st.text(max_size=20),
        max_size=4,
    ),
    body=st.dictionaries(_fields | st.text(max_size=8), _json, max_size=6),
    user_id=st.text(max_size=40)
    | st.builds(lambda s: '{"session_id": ' + s + "}", st.text(max_size=20)),
)
def test_session_of_any_request_is_a_key_or_none_never_an_error(
    headers: dict[str, str], body: dict[str, Any], user_id: str
) -> None:
    for b in (body, {**body, "metadata": {"user_id": user_id}}):
        value = session_value(Params(), headers, b)
        assert value is None or (isinstance(value, str) and value)
        # What a body parsed light keeps (its scalars and session_fields) names the same.
        light = {k: v for k, v in b.items() if not isinstance(v, dict | list)}
        assert session_value(Params(), headers, light | session_fields(b)) == value
