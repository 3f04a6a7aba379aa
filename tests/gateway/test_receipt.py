"""A request's receipt over ``FakeUpstream``: the routing-quality counters on a known sequence,
the access-log line's fields (and what it must never carry), sampling, and the route headers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from router.gateway.config.access_log import AccessLogSettings
from router.gateway.config.engines import EngineSources
from router.gateway.quality import RoutingQuality
from router.gateway.receipt import ACCESS_LOGGER, ENGINE_HEADER, OVERLAP_HEADER, Receipt, Receipts
from tests.fakes import openai_answer
from tests.gateway.rig import CHAT, TOKEN, A, B, Rig, chat, rig

PROMPT = "the conversation so far, long enough for several blocks of sixteen characters"
SECRET_PROMPT = "PROMPT-MARKER-7f3a " * 8
CLIENT_KEY = "sk-client-key-0123456789"
ENGINE_KEY = "sk-engine-key-9876543210"


@pytest.fixture(autouse=True)
def access_log_at_info() -> Iterator[None]:
    """The level ``kvrouter serve`` logs at by default (tests leave the root at WARNING)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


def access_lines(text: str) -> list[dict[str, Any]]:
    """The access-log records among captured standard-error lines."""
    out = []
    for line in text.splitlines():
        if line.startswith("{") and '"request_id"' in line:
            out.append(orjson.loads(line))
    return out


def believed(r: Rig, body: dict[str, Any]) -> int:
    """What the router believes an engine holding all of ``body``'s blocks holds, in tokens."""
    rt, keys = r.gw.core.keys_of(body)
    return min(rt.approx_tokens, len(keys) * r.gw.core.policy.block_tokens)


async def test_quality_counters_on_a_known_sequence(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        body = chat(PROMPT)
        r.up.next(openai_answer(body, cached=0, prompt=20))
        assert (await r.post(CHAT, body))[0] == 200
        engine = r.up.sent[-1]
        full = believed(r, body)
        assert full > 0
        # The second time it goes where the prefix is, which reports less than believed.
        r.up.next(openai_answer(body, cached=full - 3, prompt=20))
        assert (await r.post(CHAT, body))[0] == 200
        assert r.up.sent[-1] == engine
        name = "kvrouter_prefix_%s_tokens_total"
        assert await r.metric(name % "reachable", engine=engine) == full
        assert await r.metric(name % "routed", engine=engine) == full
        assert await r.metric(name % "achieved", engine=engine) == full - 3
        err = "kvrouter_prefix_belief_error_tokens_total"
        assert await r.metric(err, engine=engine, mode="approximate", direction="over") == 3
        assert await r.metric(err, engine=engine, mode="approximate", direction="under") == 0
        for reason in ("cap", "load", "spread", "session", "flow_control", "policy"):
            assert await r.metric("kvrouter_decisions_not_deepest_total", reason=reason) == 0


ROUND_ROBIN = "version: 1\nname: rr\nblock_chars: 16\npicker: round-robin\n"


async def test_quality_counters_count_why_a_decision_left_the_deepest_holder(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, policy_text=ROUND_ROBIN) as r:
        body = chat(PROMPT)
        for _ in range(2):  # round-robin: the second goes to the other engine
            assert (await r.post(CHAT, body))[0] == 200
        assert r.up.sent[0] != r.up.sent[1]
        name = "kvrouter_decisions_not_deepest_total"
        assert await r.metric(name, reason="policy") == 1
        assert await r.metric(name) == 1
        full = believed(r, body)
        reached = "kvrouter_prefix_reachable_tokens_total"
        assert await r.metric(reached, engine=r.up.sent[1]) == full
        assert await r.metric("kvrouter_prefix_routed_tokens_total", engine=r.up.sent[1]) == 0


async def test_quality_counters_count_only_answers_with_usage(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        body = chat(PROMPT, stream=True)  # no include_usage: the engine reports none
        assert (await r.post(CHAT, body))[0] == 200
        text = await (await r.client.get("/metrics")).text()
        assert "kvrouter_prefix_achieved_tokens_total{" not in text


async def test_quality_series_of_a_gone_engine_are_forgotten(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        assert (await r.post(CHAT, chat(PROMPT)))[0] == 200
        engine = r.up.sent[-1]
        text = await (await r.client.get("/metrics")).text()
        assert f'kvrouter_prefix_routed_tokens_total{{engine="{engine}"}}' in text
        r.gw.metrics.forget_engines([e for e in (A, B) if e != engine])
        text = await (await r.client.get("/metrics")).text()
        assert engine not in text.split("kvrouter_prefix_")[1]
        assert f'engine="{engine}"' not in text


async def test_access_log_line_has_its_fields_and_no_prompt_or_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = EngineSources(static=(A, B), api_key_env="ENGINE_KEY")
    env = {"KVROUTER_API_KEYS": f"team-a={CLIENT_KEY}", "ENGINE_KEY": ENGINE_KEY}
    async with rig(tmp_path, env=env, engines=engines) as r:
        capsys.readouterr()
        body = chat(SECRET_PROMPT, stream=True, stream_options={"include_usage": True})
        auth = {"Authorization": f"Bearer {CLIENT_KEY}", "X-Request-Id": "req-1"}
        status, _ = await r.post(CHAT, body, headers=auth)
        assert status == 200
        assert r.up.engines[r.up.sent[-1]].requests  # the engine was sent its key
    err = capsys.readouterr().err
    (line,) = [x for x in access_lines(err) if x["request_id"] == "req-1"]
    assert line["route"] == CHAT and line["status"] == 200 and line["tenant"] == "team-a"
    assert line["model"] == "m" and line["engine"] in (A, B)
    assert line["path"] == "routed" and line["attempts"] == 1
    assert line["prompt_tokens"] == 10 and line["cached_tokens"] == 0
    assert line["believed"] == 0 and line["reachable"] == 0  # a cold prefix
    assert line["divergence_block"] == 0 and line["prefix_broken_at"] is None
    assert line["ttft_ms"] is not None and line["duration_ms"] >= line["ttft_ms"] >= 0
    assert line["queue_wait_ms"] >= 0 and line["not_deepest"] is None
    for secret in ("PROMPT-MARKER", CLIENT_KEY, ENGINE_KEY):
        assert secret not in err


async def test_access_log_failed_request_path_and_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with rig(tmp_path) as r:
        for engine in r.up.engines.values():
            engine.down = True  # healthy a moment ago: every attempt fails to connect
        capsys.readouterr()
        status, _ = await r.post(CHAT, chat(PROMPT), headers={"X-Request-Id": "req-down"})
    lines = [x for x in access_lines(capsys.readouterr().err) if x["request_id"] == "req-down"]
    assert len(lines) == 1
    line = lines[0]
    assert line["status"] == status >= 500
    assert line["path"] == "failed" and line["attempts"] >= 2 and line["ttft_ms"] is None


@pytest.mark.parametrize(("sample", "written"), [(0.0, {"bad"}), (1.0, {"ok", "bad"})])
async def test_access_log_sample_keeps_every_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sample: float, written: set[str]
) -> None:
    async with rig(tmp_path, access_log=AccessLogSettings(sample=sample)) as r:
        capsys.readouterr()
        assert (await r.post(CHAT, chat(PROMPT), headers={"X-Request-Id": "ok"}))[0] == 200
        bad = {"model": "m", "messages": "not a list"}
        assert (await r.post(CHAT, bad, headers={"X-Request-Id": "bad"}))[0] == 400
    lines = access_lines(capsys.readouterr().err)
    assert {x["request_id"] for x in lines} == written
    (bad_line,) = [x for x in lines if x["request_id"] == "bad"]
    assert bad_line["path"] == "rejected" and bad_line["queue_wait_ms"] is None


async def test_access_log_off_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with rig(tmp_path, access_log=AccessLogSettings(enabled=False)) as r:
        capsys.readouterr()
        bad = {"model": "m", "messages": "not a list"}
        assert (await r.post(CHAT, bad))[0] == 400
    assert access_lines(capsys.readouterr().err) == []


@pytest.mark.parametrize("on", [False, True])
async def test_route_headers_only_when_switched_on(tmp_path: Path, on: bool) -> None:
    async with rig(tmp_path, route_headers=on) as r:
        body = chat(PROMPT)
        for _ in range(2):
            async with r.client.post(CHAT, json=body) as resp:
                assert resp.status == 200
                await resp.read()
                headers = resp.headers
        if not on:
            assert ENGINE_HEADER not in headers and OVERLAP_HEADER not in headers
        else:
            assert headers[ENGINE_HEADER] == r.up.sent[-1]
            assert int(headers[OVERLAP_HEADER]) == believed(r, body) > 0


async def test_debug_route_says_where_the_prefix_diverges(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        held = chat(PROMPT)
        assert (await r.post(CHAT, held))[0] == 200
        engine = r.up.sent[-1]
        changed = chat(PROMPT[:40] + "-- and here the text goes another way entirely --")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, out = await r.post("/debug/route", changed, headers=auth)
        assert status == 200
        block_chars = r.gw.core.policy.block_chars
        text = r.gw.core.keys_of(changed)[0].text
        assert text is not None
        first_changed = text.index("-- and here") // block_chars
        assert out["divergence"] == {
            "block": first_changed,
            "char_offset": first_changed * block_chars,
            "holders": [engine],
        }


def test_access_log_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AccessLogSettings().sample = 0.5  # type: ignore[misc]


async def test_access_log_lines_of_one_loop_turn_go_out_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    receipts = Receipts(AccessLogSettings(), RoutingQuality(CollectorRegistry()))
    capsys.readouterr()
    for n in range(3):
        receipts.close(Receipt(f"turn-{n}", CHAT, 0.0), 400, 0.5)
    assert capsys.readouterr().err == ""  # still this turn
    await asyncio.sleep(0)
    lines = access_lines(capsys.readouterr().err)
    assert [x["request_id"] for x in lines] == ["turn-0", "turn-1", "turn-2"]
    assert all(x["duration_ms"] == 500.0 and x["path"] == "rejected" for x in lines)


def test_access_log_line_without_a_loop_is_written_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    receipts = Receipts(AccessLogSettings(), RoutingQuality(CollectorRegistry()))
    capsys.readouterr()
    receipts.close(Receipt("alone", CHAT, 0.0), 500, 0.25)
    (line,) = access_lines(capsys.readouterr().err)
    assert line["request_id"] == "alone" and line["status"] == 500
