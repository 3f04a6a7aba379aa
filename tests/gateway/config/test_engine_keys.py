"""Per-engine API keys: where they come from, and that every call to such an engine carries one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from router.core.fields import ConfigError
from router.gateway.config.engine_keys import EngineKeys
from router.gateway.config.overrides import with_overrides
from router.gateway.config.settings import load_config_text
from router.gateway.precise.tokenize import Tokenizer
from router.gateway.upstream.client import HttpUpstream, UpstreamRequest
from tests.gateway.precise.test_tokenize import engines, inbound, words
from tests.support import (
    CHECKOUT_KVROUTER,
    LOOPBACK,
    free_port,
    http_json,
    metric,
    running,
    start_kvrouter,
    status_of,
    wait_until,
)

ENGINES = """
engines:
  api_key_env: FLEET_KEY
  static:
    - http://a:8000
    - {url: "http://B:8000/", api_key_env: B_KEY}
  dns: {name: vllm.example, api_key_env: DNS_KEY}
"""


def keys(text: str, environ: dict[str, str]) -> EngineKeys:
    return EngineKeys(load_config_text(text, "c.yaml").engines, environ)


def test_each_engine_gets_its_own_key_else_its_rules_else_the_sections() -> None:
    env = {"FLEET_KEY": "sk-fleet", "B_KEY": " sk-b\n", "DNS_KEY": "sk-dns"}
    k = keys(ENGINES, env)
    assert k("http://a:8000") == "Bearer sk-fleet"
    assert k("http://b:8000") == "Bearer sk-b"  # the URL canonical, the value stripped
    assert k("http://10.0.0.7:8000") == "Bearer sk-dns"  # not static: found by the DNS rule
    no_dns_key = keys("engines: {api_key_env: FLEET_KEY, dns: {name: x}}", env)
    assert no_dns_key("http://10.0.0.7:8000") == "Bearer sk-fleet"
    assert keys("engines: {static: [http://a]}", {})("http://a:80") is None
    assert "sk-" not in repr(k)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"B_KEY": "x", "DNS_KEY": "y"}, "FLEET_KEY is unset or empty"),
        ({"FLEET_KEY": "x", "B_KEY": "   ", "DNS_KEY": "y"}, "B_KEY is unset or empty"),
        ({"FLEET_KEY": "x", "B_KEY": "a b", "DNS_KEY": "y"}, "B_KEY holds characters"),
        ({"FLEET_KEY": "x", "B_KEY": "k\u00e9y", "DNS_KEY": "y"}, "B_KEY holds characters"),
    ],
)
def test_unusable_key_variable_named_value_never_shown(
    environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected) as e:
        keys(ENGINES, environ)
    assert all(v.strip() not in str(e.value) for v in environ.values() if len(v.strip()) > 1)


def test_engine_api_key_env_flag_sets_the_sections_variable() -> None:
    cfg = with_overrides(load_config_text("", "c"), engine_api_key_env="K")
    assert EngineKeys(cfg.engines, {"K": "sk"})("http://any:1") == "Bearer sk"


async def test_upstream_sends_the_engines_key_instead_of_the_clients() -> None:
    seen: list[str | None] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        assert len(request.headers.getall("Authorization", [])) <= 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    engine = f"http://{LOOPBACK}:{port}"
    keyed = {engine: "Bearer sk-engine"}
    up = HttpUpstream(2, authorization=keyed.get)
    try:
        client = [("Authorization", "Bearer sk-client"), ("Content-Type", "text/plain")]
        resp = await up.send(UpstreamRequest(engine, "/v1/completions", client, b"{}"))
        assert await resp.read_chunk() == b"ok"
        resp.release()
        assert (await up.fetch(engine, "/health", 2))[0] == 200
        other = HttpUpstream(2)  # no key configured: the request's headers as they are
        try:
            resp = await other.send(UpstreamRequest(engine, "/x", client, b""))
            await resp.read_chunk()
            resp.release()
            await other.fetch(engine, "/metrics", 2)
        finally:
            await other.close()
    finally:
        await up.close()
        await runner.cleanup()
    assert seen == ["Bearer sk-engine", "Bearer sk-engine", "Bearer sk-client", None]


def test_engine_with_api_key_probed_listed_scraped_and_served(tmp_path: Path) -> None:
    """engine-sim guards every route; only the gateway that holds the key comes ready."""
    with running([]) as procs:
        sim = start_kvrouter(
            ["engine-sim", "--fast", "--api-key", "sk-engine"],
            tmp_path,
            ready_headers={"Authorization": "Bearer sk-engine"},
        )
        procs.append(sim)
        keyless = start_kvrouter(["serve", "--engine", sim.url], tmp_path)
        procs.append(keyless)
        cfg = tmp_path / "keyed.yaml"
        cfg.write_text(f"engines: {{static: [{{url: '{sim.url}', api_key_env: ENGINE_KEY}}]}}\n")
        keyed = start_kvrouter(
            ["serve", "--config", str(cfg)],
            tmp_path,
            ready_path="/ready",
            env={"ENGINE_KEY": "sk-engine"},
        )
        procs.append(keyed)
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        got = http_json(f"{keyed.url}/v1/chat/completions", body)
        assert got["choices"][0]["message"]["content"]
        assert [m["id"] for m in http_json(f"{keyed.url}/v1/models")["data"]] == ["sim-model"]
        wait_until(
            lambda: metric(keyed, "kvrouter_engine_scrapes_total", result="ok") > 0,
            "a metrics scrape with the key",
        )
        # Started first, probed at least as often: without the key the engine answers 401.
        assert status_of(f"{keyless.url}/ready") == 503
        assert metric(keyless, "kvrouter_backend_healthy") == 0
        # A variable the config names but nobody set stops the start, naming it: exit 2.
        env = {k: v for k, v in os.environ.items() if k != "ENGINE_KEY"}
        port = str(free_port())
        args = [*CHECKOUT_KVROUTER, "serve", "--config", str(cfg), "--port", port]
        gone = subprocess.run(args, env=env, capture_output=True, timeout=60, check=False)
        assert gone.returncode == 2
        assert b"ENGINE_KEY is unset or empty" in gone.stderr and b"Traceback" not in gone.stderr


async def test_tokenizer_calls_carry_the_engines_key() -> None:
    keys_seen: list[str | None] = []

    async def keyed(request: web.Request) -> web.Response:
        keys_seen.append(request.headers.get("Authorization"))
        return web.Response(body=orjson.dumps({"tokens": [1, 2, 3], "count": 3}))

    async with engines(1, keyed) as (urls, _asked):
        up = HttpUpstream(2, authorization={urls[0]: "Bearer sk-engine"}.get)
        tok = Tokenizer(2.0, lambda _model: urls, upstream=up)
        try:
            got = await tok(inbound(words(0, 10)))
        finally:
            await tok.close()
            await up.close()  # the gateway's: the tokenizer leaves it open
    assert got is not None and list(got.token_ids) == [1, 2, 3]
    assert keys_seen == ["Bearer sk-engine"]
