"""The app's own routes over ``FakeUpstream``: probes, models, metrics, the admin endpoints, and
engines found by DNS."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.gateway.config.engines import DnsEngines, EngineSources
from tests.fakes import FakeEngine
from tests.gateway.rig import CHAT, TOKEN, A, B, chat, rig
from tests.support import metric_in

# -- probes, models, metrics ---------------------------------------------------------------


async def test_ready_503_until_backend_healthy(tmp_path: Path) -> None:
    engine = FakeEngine(A, down=True)
    async with rig(tmp_path, engine, ready=False) as r:
        async with r.client.get("/ready") as resp:
            assert resp.status == 503
            assert (await resp.json())["reason"] == "no healthy engine yet"
        assert (await r.client.get("/health")).status == 200
        engine.down = False
        await r.gw.pool.probe_all()
        async with r.client.get("/ready") as resp:
            assert resp.status == 200
            assert (await resp.json())["policy"] == "test-kv"


async def test_models_union_of_healthy_backends(tmp_path: Path) -> None:
    async with rig(tmp_path, FakeEngine(A, ["m", "x"]), FakeEngine(B, ["m", "y"])) as r:
        async with r.client.get("/v1/models") as resp:
            body = await resp.json()
        assert body["object"] == "list"
        assert [c["id"] for c in body["data"]] == ["m", "x", "y"]


EXPECTED_METRICS = {
    "kvrouter_requests",
    "kvrouter_request_duration_seconds",
    "kvrouter_ttft_seconds",
    "kvrouter_routing_decision_seconds",
    "kvrouter_prefix_overlap_ratio",
    "kvrouter_backend_inflight_requests",
    "kvrouter_backend_inflight_tokens",
    "kvrouter_backend_healthy",
    "kvrouter_backend_requests",
    "kvrouter_cached_tokens",
    "kvrouter_prompt_tokens",
    "kvrouter_index_blocks",
    "kvrouter_policy_reloads",
    "kvrouter_retries",
    "kvrouter_gossip_peers",
}


async def test_metrics_every_contract_name_exported(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await r.post(CHAT, chat())
        async with r.client.get("/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
        names = {fam.name for fam in text_string_to_metric_families(text)}
        assert names >= EXPECTED_METRICS
        assert metric_in(text, "kvrouter_policy_reloads_total", result="error") == 0
        assert metric_in(text, "kvrouter_gossip_peers") == 0
        assert metric_in(text, "kvrouter_requests_total", route=CHAT, code="200") == 1


async def test_metrics_registry_owned_by_each_app(tmp_path: Path) -> None:
    async with rig(tmp_path) as r1:
        (tmp_path / "b").mkdir()
        async with rig(tmp_path / "b") as r2:
            await r1.post(CHAT, chat())
            assert await r1.metric("kvrouter_requests_total") == 1
            assert await r2.metric("kvrouter_requests_total") == 0


# -- admin ---------------------------------------------------------------------------------


async def test_admin_off_without_token_404(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        status, _ = await r.post("/debug/route", chat(), headers={"Authorization": "Bearer x"})
        assert status == 404


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", ["/debug/route", "/debug/backends"])
async def test_admin_off_any_method_404_like_an_unknown_path(
    tmp_path: Path, method: str, path: str
) -> None:
    async with rig(tmp_path) as r:
        async with r.client.request(method, path) as got:
            body = await got.json()
        async with r.client.request(method, "/no/such/route") as unknown:
            assert (got.status, unknown.status) == (404, 404)
        assert body["error"]["code"] == "not_found"


async def test_admin_on_wrong_method_405_only_after_the_token(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        async with r.client.get("/debug/route") as anonymous:
            assert anonymous.status == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with r.client.get("/debug/route", headers=auth) as got:
            assert got.status == 405 and got.headers["Allow"] == "POST"
            assert (await got.json())["error"]["code"] == "method_not_allowed"
        async with r.client.post("/debug/backends", headers=auth) as got:
            assert got.status == 405


@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]
)
async def test_admin_wrong_or_missing_token_401(tmp_path: Path, auth: str | None) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        headers = {"Authorization": auth} if auth else {}
        status, body = await r.post("/debug/route", chat(), headers=headers)
        assert status == 401 and body["error"]["type"] == "authentication_error"


async def test_admin_debug_route_explains_without_load_or_blocks(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, body = await r.post("/debug/route", chat("a long prompt " * 10), headers=auth)
        assert status == 200, body
        assert body["policy"] == "test-kv" and body["engine"] in (A, B)
        assert {c["engine"] for c in body["candidates"]} == {A, B}
        assert body["blocks"] > 0
        assert len(r.gw.core.index) == 0 and r.gw.core.loads.local_all() == {}
        assert r.up.sent == []
        async with r.client.get("/debug/backends", headers=auth) as resp:
            backends = (await resp.json())["backends"]
        assert {b["url"] for b in backends} == {A, B}
        assert all(b["state"] == "healthy" for b in backends)


async def test_admin_debug_route_bad_body_400(tmp_path: Path) -> None:
    async with rig(tmp_path, env={"KVROUTER_ADMIN_TOKEN": TOKEN}) as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, _ = await r.post("/debug/route", b"[]", headers=auth)
        assert status == 400


async def test_admin_token_env_name_from_config(tmp_path: Path) -> None:
    env = {"MY_TOKEN": TOKEN}
    async with rig(tmp_path, env=env, admin_token_env="MY_TOKEN") as r:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await r.post("/debug/route", chat(), headers=auth))[0] == 200


# -- discovery -----------------------------------------------------------------------------


async def test_dns_backends_resolved_probed_and_routed(tmp_path: Path) -> None:
    dns = DnsEngines("localhost", 9, interval_seconds=3600)
    engine = FakeEngine("http://127.0.0.1:9")
    async with rig(tmp_path, engine, engines=EngineSources(dns=(dns,))) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
        assert r.up.sent == ["http://127.0.0.1:9"]
        assert r.gw.pool.engines["http://127.0.0.1:9"].source == "dns:localhost"
