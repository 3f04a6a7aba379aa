"""session-affinity: how a request names its session, and the bounded map of where it went."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.decision import RoutingCore
from router.core.policy import load_policy_text
from router.core.scorers.session_affinity import Params, Sessions, session_key, session_of

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
