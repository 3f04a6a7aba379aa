"""Session affinity through the exchange: one session's requests stay on one engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import FakeEngine
from tests.gateway.rig import CHAT, A, B, C, chat, rig

SESSION_POLICY = """
name: sessions
block_chars: 16
cold_prefix: score  # with ring, a prefix nobody holds goes to its ring home whatever the session
scorers:
  - type: session-affinity
    weight: 10
    header: X-Session-Id
  - type: load
    weight: 1
"""


@pytest.mark.parametrize("how", ["header", "user-field"], ids=["session-header", "body-user-field"])
async def test_session_affinity_keeps_a_session_on_one_backend(tmp_path: Path, how: str) -> None:
    engines = (FakeEngine(A), FakeEngine(B), FakeEngine(C))
    async with rig(tmp_path, *engines, policy_text=SESSION_POLICY) as r:
        for i in range(6):
            body = chat(f"{i:03d} unrelated prompt {i}")
            headers = {}
            if how == "header":
                headers["X-Session-Id"] = "conversation-42"
            else:
                body["user"] = "conversation-42"
            assert (await r.post(CHAT, body, headers=headers))[0] == 200
        assert len(set(r.up.sent)) == 1
