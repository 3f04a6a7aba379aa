"""The picker and the proxy decide alike: the same request sequence, through a proxy-mode
gateway and through the picker (each on a fresh gateway over the same fake engines), goes to
the same engine every time, in both of Envoy's body modes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from router.gateway.config.serving import Limits
from router.presets import preset_path
from tests.fakes import FakeEngine
from tests.gateway.extproc.envoy_standin import BUFFERED, FULL_DUPLEX, FilterConfig
from tests.gateway.extproc.picking import picking
from tests.gateway.rig import CHAT, A, B, C, rig


def sequence(n: int = 40, seed: int = 7) -> list[dict[str, Any]]:
    """Multi-turn chats of a few tenants sharing system prompts: prefixes to follow."""
    rng = random.Random(seed)
    systems = [f"system prompt number {i}, " * 60 for i in range(3)]
    chats: list[list[dict[str, str]]] = [
        [{"role": "system", "content": rng.choice(systems)}] for _ in range(6)
    ]
    out = []
    for i in range(n):
        turns = rng.choice(chats)
        turns.append({"role": "user", "content": f"question {i} " * rng.randint(10, 80)})
        out.append({"model": "m", "messages": list(turns)})
        turns.append({"role": "assistant", "content": f"answer {i}"})
    return out


KV_AWARE = preset_path("kv-aware").read_text()
LIMITS = Limits(max_body_bytes=1024 * 1024, max_attempts=3)


def engines() -> tuple[FakeEngine, ...]:
    return FakeEngine(A), FakeEngine(B), FakeEngine(C)


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_picker_decides_as_the_proxy_does(tmp_path: Path, mode: int) -> None:
    bodies = sequence()
    (tmp_path / "proxy").mkdir()
    async with rig(tmp_path / "proxy", *engines(), policy_text=KV_AWARE, limits=LIMITS) as r:
        for body in bodies:
            status, _ = await r.post(CHAT, body)
            assert status == 200
        proxied = list(r.up.sent)
    (tmp_path / "picker").mkdir()
    config = FilterConfig(request_body_mode=mode, response_body_mode=mode)
    async with picking(tmp_path / "picker", *engines(), policy_text=KV_AWARE, limits=LIMITS) as p:
        picked = []
        for body in bodies:
            routed = await p.route(json.dumps(body).encode(), config)
            picked.append(p.server.endpoints.engine_of(routed.endpoints[0]))
    assert len(set(proxied)) > 1  # the sequence spreads; agreement is not one engine for all
    assert picked == proxied
