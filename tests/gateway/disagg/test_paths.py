"""Where disaggregation applies and what the gateway sends (router.gateway.disagg.paths): every
fixture of the peers' proxies (tests/fixtures/pd) replayed through the gateway, byte for byte
in key order; /debug/route's account; the whole path; the metrics per role."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.gateway.config.serving import Limits
from router.gateway.disagg import paths
from tests.fakes import FakeEngine, Script, error_answer
from tests.gateway.disagg.fixtures import REQUEST_ID, load_all, placed, same
from tests.gateway.disagg.pd_rig import D, P, body_of, busy, chat, engines, header, pd
from tests.gateway.rig import CHAT, TOKEN, rig

FIXTURES = load_all()
CLIENT_ID = "fixture-request-1"
BIG = Limits(max_body_bytes=1 << 20, max_attempts=3)
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("fixture", [f for _, f in FIXTURES], ids=[n for n, _ in FIXTURES])
async def test_the_gateway_sends_what_the_peers_proxy_sends(
    tmp_path: Path, fixture: dict[str, Any]
) -> None:
    client = fixture["client"]
    model = client["body"]["model"]
    p, d = (FakeEngine(e.url, models=[model], metrics=e.metrics) for e in engines(P, D))
    port = fixture["prefill"]["body"].get("bootstrap_port")  # sglang's: what the proxy knew
    changes = pd(fixture["protocol"], (P, D), bootstrap_port=port)
    async with rig(tmp_path, p, d, limits=BIG, **changes) as r:
        await busy(r, D)
        if fixture["protocol"] == "vllm":
            p.scripts.append(Script(chunks=[orjson.dumps(fixture["prefill_answer"])]))
        status, _ = await r.post(
            client["path"], client["body"], headers={"X-Request-Id": CLIENT_ID}
        )
        assert status == 200
        for side, engine in (("prefill", p), ("decode", d)):
            want = fixture[side]
            (got,) = engine.requests
            assert got.path == want["path"]
            sent = body_of(got)
            if fixture["protocol"] == "sglang":
                assert sent["bootstrap_host"] == "prefill-0"
                # The one field beyond the peers': SGLang's own request id, which the gateway
                # adds to name the request in /abort_request when its client leaves.
                assert sent.pop("rid").startswith(CLIENT_ID)
            body = placed(sent, want["body"])
            assert same(body, want["body"]), (side, body, want["body"])
            for name, value in want["headers"].items():
                given = header(got, name)
                assert (REQUEST_ID if given == CLIENT_ID else given) == value, name


async def test_debug_route_shows_both_estimates_and_the_path(tmp_path: Path) -> None:
    p, d = engines(P, D)
    env = {"KVROUTER_ADMIN_TOKEN": TOKEN}
    async with rig(tmp_path, p, d, env=env, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        status, doc = await r.post("/debug/route", chat(), headers=ADMIN)
        assert status == 200
        split = doc["disaggregation"]
        assert split["path"] == "split" and split["why"] == "split-cheaper"
        assert (split["engine"], split["prefill_engine"]) == (D, P)
        estimates = split["estimates"]
        assert estimates["split_seconds"] < estimates["whole_seconds"]
        assert split["transfer"]["bytes"] > 0 and split["transfer"]["tokens"] > 0
        assert doc["engine"] == D and doc["policy"] == "test-kv"  # the answering decision's
        assert p.requests == d.requests == []  # nothing sent, nothing counted
        assert (
            await r.metric("kvrouter_disagg_decisions_total", path="split", why="split-cheaper")
            == 0
        )


async def test_debug_route_of_an_aggregated_fleet_is_as_before(tmp_path: Path) -> None:
    env = {"KVROUTER_ADMIN_TOKEN": TOKEN}
    async with rig(tmp_path, env=env) as r:
        status, doc = await r.post("/debug/route", chat(), headers=ADMIN)
        assert status == 200 and "disaggregation" not in doc and doc["engine"]


async def test_a_follow_up_with_few_new_tokens_stays_whole_on_its_decode_engine(
    tmp_path: Path,
) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        p.scripts.append(Script(chunks=[orjson.dumps({"kv_transfer_params": {"x": 1}})]))
        assert (await r.post(CHAT, chat()))[0] == 200
        turn = chat()
        turn["messages"] += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and?"},
        ]
        # vLLM's engines answer a whole request with "kv_transfer_params": null too.
        d.scripts.append(Script(chunks=[orjson.dumps({"choices": [], "kv_transfer_params": None})]))
        status, answer = await r.post(CHAT, turn)
        assert status == 200 and answer == {"choices": []}
        assert len(p.requests) == 1 and len(d.requests) == 2
        assert "kv_transfer_params" not in body_of(d.requests[1])
        m = r.metric
        assert await m("kvrouter_disagg_decisions_total", path="whole", why="few-new-tokens") == 1


async def test_other_routes_run_whole_and_are_not_counted(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        status, _ = await r.post("/v1/embeddings", {"model": "m", "input": "hello"})
        assert status == 200
        assert len(p.requests) + len(d.requests) == 1
        text = await (await r.client.get("/metrics")).text()
        assert 'kvrouter_disagg_decisions_total{path="split"' in text  # exported from the start
        for path in ("whole", "split"):
            for why in ("split-cheaper", "whole-cheaper"):
                assert await r.metric("kvrouter_disagg_decisions_total", path=path, why=why) == 0


async def test_under_sglang_a_whole_run_never_goes_to_a_decode_server(tmp_path: Path) -> None:
    both, d = FakeEngine("http://both-0:8000"), FakeEngine(D)
    async with rig(tmp_path, both, d, **pd("sglang", (both.url, D))) as r:
        s = r.gw.services
        decision = s.core.decide(chat(), (both.url, D), s.clock())
        assert paths.whole_plan(s, decision, 3) == (both.url,)
        both.scripts.append(error_answer(503))
        d.scripts.append(error_answer(503))
        # Whichever the core picks, the decode server is asked only as one side of a pair
        # (alone it would wait for a prefill that never comes).
        status, _ = await r.post(CHAT, chat())
        assert status == 502 and both.url in r.up.sent
        assert all("bootstrap_room" in body_of(q) for q in d.requests)


async def test_in_flight_load_per_role(tmp_path: Path) -> None:
    p, d = engines(P, D)
    async with rig(tmp_path, p, d, **pd("vllm", (P, D))) as r:
        await busy(r, D)
        gate = asyncio.Event()
        p.scripts.append(Script(chunks=[orjson.dumps({"kv_transfer_params": {"x": 1}})], gate=gate))
        task = asyncio.create_task(r.post(CHAT, chat()))
        for _ in range(200):
            if p.requests:
                break
            await asyncio.sleep(0.01)
        m = r.metric
        assert await m("kvrouter_role_inflight_requests", role="prefill") == 1
        assert await m("kvrouter_role_inflight_requests", role="decode") == 0
        gate.set()
        assert (await task)[0] == 200
        assert await m("kvrouter_role_inflight_requests", role="prefill") == 0
        assert await m("kvrouter_role_inflight_requests", role="both") == 0
