"""Model aliases through ``kvrouter serve``: rewritten before routing and forwarding, listed
by /v1/models, and reloaded with the config file (a bad edit keeps the old aliases) while the
policy file goes on reloading on its own."""

from __future__ import annotations

import signal
import urllib.error
from pathlib import Path
from typing import Any

import openai
import pytest

from router.presets import preset_path
from tests.gateway.integration import MODEL
from tests.gateway.integration.test_gateway import assert_inflight_zero, replace_file
from tests.support import Proc, http_json, metric, readiness, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

CONFIG = """
engines: {{static: ["{url}"]}}
policy: {policy}
policy_reload: {{enabled: true, interval_seconds: 0.2}}
models:
  aliases: {aliases}
  patterns: [{{match: "gpt-4*", model: {model}}}]
"""


def write(config: Path, engine: Proc, policy: Path, aliases: str) -> None:
    replace_file(config, CONFIG.format(url=engine.url, policy=policy, aliases=aliases, model=MODEL))


def models(router: Proc) -> set[str]:
    return {m["id"] for m in http_json(f"{router.url}/v1/models")["data"]}


def chat(router: Proc, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    got: dict[str, Any] = http_json(f"{router.url}/v1/chat/completions", body)
    return got


def test_aliases_route_list_and_reload_with_the_config_file(
    tmp_path: Path, procs: list[Proc]
) -> None:
    engine = start_kvrouter(["engine-sim", "--fast"], tmp_path)  # serves MODEL only
    procs.append(engine)
    policy = tmp_path / "policy.yaml"
    policy.write_text(preset_path("kv-aware").read_text())
    config = tmp_path / "serve.yaml"
    write(config, engine, policy, f"{{fast: {MODEL}}}")
    router = start_kvrouter(["serve", "--config", str(config), "--host", "127.0.0.1"], tmp_path)
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] == 1, "the engine healthy")

    # engine-sim answers 404 for any model but its own: a 200 means the served name went on.
    assert models(router) == {MODEL, "fast"}
    with openai.OpenAI(base_url=f"{router.url}/v1", api_key="k", max_retries=0) as c:
        out = c.chat.completions.create(
            model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert out.choices[0].message.content
        assert [m.id for m in c.models.list()] == sorted([MODEL, "fast"])
    assert chat(router, "gpt-4o-mini")["model"] == MODEL  # by the pattern
    with pytest.raises(urllib.error.HTTPError) as refused:
        chat(router, "quick")
    with refused.value:
        assert refused.value.code == 404

    ok = metric(router, "kvrouter_config_reloads_total", result="success")
    write(config, engine, policy, f"{{quick: {MODEL}}}")
    wait_until(lambda: models(router) == {MODEL, "quick"}, "the new aliases listed")
    assert chat(router, "quick")["model"] == MODEL
    assert metric(router, "kvrouter_config_reloads_total", result="success") == ok + 1

    # An alias naming itself: refused, counted, logged; the aliases in use stay.
    write(config, engine, policy, "{quick: quick}")
    wait_until(
        lambda: metric(router, "kvrouter_config_reloads_total", result="error") == 1,
        "the bad edit refused",
    )
    assert chat(router, "quick")["model"] == MODEL
    assert "models.aliases.quick: the alias names itself" in router.log()

    # The policy file reloads on its own, untouched by the config file's watcher.
    policies = metric(router, "kvrouter_policy_reloads_total", result="success")
    replace_file(policy, preset_path("least-load").read_text())
    wait_until(lambda: readiness(router)["policy"] == "least-load", "the policy reloaded")
    assert metric(router, "kvrouter_policy_reloads_total", result="success") == policies + 1

    # Back to the content in use: nothing to reload; SIGHUP reloads it anyway.
    write(config, engine, policy, f"{{quick: {MODEL}}}")
    router.popen.send_signal(signal.SIGHUP)
    wait_until(
        lambda: metric(router, "kvrouter_config_reloads_total", result="success") == ok + 2,
        "SIGHUP reloads the models section",
    )
    assert chat(router, "quick")["model"] == MODEL
    assert_inflight_zero(router)
