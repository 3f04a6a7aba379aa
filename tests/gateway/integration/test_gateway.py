"""``kvrouter serve`` as a real process in front of real ``engine-sim`` processes, on loopback.

The official ``openai`` client talks to the gateway. Faults are injected into the engines
(``POST /fault``); the gateway's own ``/debug/route`` (admin) says which engine a request will
go to, so a fault can be aimed at it. Every loop is bounded in count and time, nothing asserts
on durations, and each test ends with the gateway's in-flight gauges back at zero.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.presets import preset_path
from tests.gateway.integration import ADMIN, ADMIN_ENV, MODEL
from tests.support import (
    Proc,
    ametric,
    eventually,
    http_json,
    metric,
    metrics_text,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
# Long enough for several of the policy's 512-character blocks, in engine-sim's words.
SYSTEM = " ".join(f"rule{i} be concise and accurate" for i in range(60))

CONFIG = """
policy: {policy}
policy_reload: {{enabled: true, interval_seconds: 0.2}}
health: {{interval_seconds: 0.5, timeout_seconds: 2, eject_after_failures: 3,
         readmit_backoff_seconds: 1, readmit_backoff_max_seconds: 4}}
timeouts: {{connect_seconds: 2, first_byte_seconds: 2, idle_stream_seconds: 5}}
limits: {{max_body_bytes: 65536, max_attempts: 3}}
"""


def assert_inflight_zero(router: Proc) -> None:
    """Every in-flight gauge back at zero (the load of every request was given back)."""

    def zero() -> bool:
        fams = text_string_to_metric_families(metrics_text(router))
        samples = [
            s for f in fams if f.name.startswith("kvrouter_backend_inflight") for s in f.samples
        ]
        return bool(samples) and all(s.value == 0 for s in samples)

    wait_until(zero, "in-flight gauges back to zero")


@dataclass
class Fleet:
    engines: list[Proc]
    router: Proc
    policy: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.router.url}/v1", api_key="client-key", max_retries=0, timeout=20
        )

    def target(self, body: dict[str, Any]) -> Proc:
        """The engine the gateway would pick for ``body`` right now."""
        got = http_json(f"{self.router.url}/debug/route", body, ADMIN)
        return next(e for e in self.engines if e.url == got["engine"])

    def fault(self, engine: Proc, **fault: Any) -> None:
        http_json(f"{engine.url}/fault", fault)

    def stats(self, engine: Proc) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"{engine.url}/stats")
        return result


def start_fleet(
    tmp: Path, procs: list[Proc], n: int = 2, engine_args: tuple[str, ...] = ("--fast",)
) -> Fleet:
    engines = [start_kvrouter(["engine-sim", *engine_args], tmp) for _ in range(n)]
    procs.extend(engines)
    policy = tmp / "policy.yaml"
    shutil.copyfile(preset_path("kv-aware"), policy)
    config = tmp / "serve.yaml"
    config.write_text(CONFIG.format(policy=policy))
    args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
    for e in engines:
        args += ["--backend", e.url]
    env = ADMIN_ENV
    # Listening first (/health), then ready with every backend healthy: /ready alone would
    # pass with one healthy engine, and the tests want all of them.
    router = start_kvrouter(args, tmp, env=env)
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] == n, "all backends healthy")
    return Fleet(engines, router, policy)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("serve")
    with running([]) as procs:
        f = start_fleet(tmp, procs)
        yield f
        for e in f.engines:
            f.fault(e, mode="clear")
        assert f.router.stop() == 0
        assert "Traceback" not in f.router.log()


def chat_body(user: str, stream: bool = False, system: str = SYSTEM) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "stream": stream,
    }


# -- the OpenAI surface through the gateway --------------------------------------------------


def test_openai_chat_stream_and_not(fleet: Fleet) -> None:
    with fleet.client() as c:
        full = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=3
        )
        assert full.choices[0].message.content
        chunks = list(
            c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert len(text.split()) == 3
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert metric(fleet.router, "kvrouter_ttft_seconds_count") >= 1
    assert_inflight_zero(fleet.router)


def test_openai_stream_read_to_done_counts_as_success_with_usage(
    tmp_path: Path, procs: list[Proc]
) -> None:
    # The openai client closes the connection as soon as it reads [DONE]; the router must
    # still count the request as answered and take the engine's usage into its totals. A timed
    # engine sends the end of its stream after the last event, which is where the race was.
    timed = ("--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", "400")
    fleet = start_fleet(tmp_path, procs, n=1, engine_args=timed)
    ok = metric(fleet.router, "kvrouter_requests_total", route=CHAT, code="200")
    prompt = metric(fleet.router, "kvrouter_prompt_tokens_total")
    cached = metric(fleet.router, "kvrouter_cached_tokens_total")
    seen_prompt = seen_cached = 0
    with fleet.client() as c:
        for i in range(6):
            stream = c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}],
                max_tokens=2 + i % 2,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = [ch.usage for ch in stream if ch.usage is not None][-1]
            seen_prompt += usage.prompt_tokens
            details = usage.prompt_tokens_details
            seen_cached += details.cached_tokens or 0 if details is not None else 0
    assert metric(fleet.router, "kvrouter_requests_total", route=CHAT, code="200") - ok == 6
    assert metric(fleet.router, "kvrouter_prompt_tokens_total") - prompt == seen_prompt
    assert metric(fleet.router, "kvrouter_cached_tokens_total") - cached == seen_cached > 0
    assert_inflight_zero(fleet.router)


def test_openai_completions_stream_and_not_embeddings_models(fleet: Fleet) -> None:
    with fleet.client() as c:
        full = c.completions.create(model=MODEL, prompt="a b c", max_tokens=2)
        streamed = list(
            c.completions.create(model=MODEL, prompt="a b c", max_tokens=2, stream=True)
        )
        assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == full.choices[0].text
        emb = c.embeddings.create(model=MODEL, input=["x", "y"])
        assert len(emb.data) == 2
        assert [m.id for m in c.models.list()] == [MODEL]
    assert_inflight_zero(fleet.router)


def test_openai_errors_404_400_413(fleet: Fleet) -> None:
    with fleet.client() as c:
        with pytest.raises(openai.NotFoundError) as nf:
            c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        assert nf.value.status_code == 404
        with pytest.raises(openai.BadRequestError) as bad:
            c.chat.completions.create(model=MODEL, messages=[])
        assert "messages" in str(bad.value)
        with pytest.raises(openai.APIStatusError) as big:
            c.completions.create(model=MODEL, prompt="x" * 70_000)
        assert big.value.status_code == 413
    assert_inflight_zero(fleet.router)


def test_prefix_routing_same_engine_reports_cached_tokens(fleet: Fleet) -> None:
    before = {e.url: fleet.stats(e)["requests"] for e in fleet.engines}
    cached = []
    with fleet.client() as c:
        for i in range(5):
            r = c.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": "prefix-test " + SYSTEM},
                    {"role": "user", "content": f"question number {i}"},
                ],
                max_tokens=2,
            )
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
    served = {e.url: fleet.stats(e)["requests"] - before[e.url] for e in fleet.engines}
    assert sorted(served.values()) == [0, 5], served  # one engine took the whole prefix
    assert cached[0] == 0 and all(n > 0 for n in cached[1:]), cached
    assert metric(fleet.router, "kvrouter_cached_tokens_total") > 0
    assert_inflight_zero(fleet.router)


# -- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [{"mode": "status", "status": 503}, {"mode": "hang"}],
    ids=["engine-503", "hang-first-byte-timeout"],
)
def test_fault_before_first_byte_retried_on_other_engine(
    fleet: Fleet, fault: dict[str, Any]
) -> None:
    body = chat_body(f"retry me {fault['mode']}, a long question " * 40)
    target = fleet.target(body)
    other = next(e for e in fleet.engines if e is not target)
    held_before = overlaps(fleet, body)
    retries = metric(fleet.router, "kvrouter_retries_total")
    before = fleet.stats(other)["requests"]
    fleet.fault(target, **fault)
    with fleet.client() as c:
        r = c.chat.completions.create(**body)
    assert r.choices[0].message.content
    assert fleet.stats(other)["requests"] == before + 1
    assert metric(fleet.router, "kvrouter_retries_total") == retries + 1
    code = "503" if fault["mode"] == "status" else "timeout"
    assert (
        metric(fleet.router, "kvrouter_backend_requests_total", backend=target.url, code=code) >= 1
    )
    assert_inflight_zero(fleet.router)
    # The failed attempt left no belief behind: only the engine that answered holds the whole
    # prompt; the one that failed holds no more than before (the shared system prompt, if any).
    held_after = overlaps(fleet, body)
    assert held_after[target.url] == held_before[target.url] < held_after["blocks"]
    assert held_after[other.url] == held_after["blocks"] > 0
    assert fleet.target(body) is other


def overlaps(fleet: Fleet, body: dict[str, Any]) -> dict[str, int]:
    """Per engine, the leading blocks of ``body`` the gateway believes it holds; and "blocks"."""
    got = http_json(f"{fleet.router.url}/debug/route", body, ADMIN)
    return {"blocks": got["blocks"]} | {c["engine"]: c["overlap_blocks"] for c in got["candidates"]}


def test_fault_drop_mid_stream_ends_with_error_event(fleet: Fleet) -> None:
    body = chat_body("drop me mid stream", stream=True)
    body["max_tokens"] = 8
    fleet.fault(fleet.target(body), mode="drop-mid-stream")
    got: list[str] = []
    with fleet.client() as c, pytest.raises(openai.APIError) as err:
        for chunk in c.chat.completions.create(**body):
            if chunk.choices:
                got.append(chunk.choices[0].delta.content or "")
    assert "".join(got).strip(), "the stream had started before it broke"
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "upstream_dropped"
    assert_inflight_zero(fleet.router)


# -- admin and metrics ---------------------------------------------------------------------


def test_admin_endpoint_needs_the_token(fleet: Fleet) -> None:
    url = f"{fleet.router.url}/debug/route"
    for headers in ({}, {"Authorization": "Bearer nope"}):
        req = urllib.request.Request(url, json.dumps(chat_body("x")).encode(), headers=headers)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        e.value.close()
        assert e.value.code == 401
    got = http_json(url, chat_body("x"), ADMIN)
    assert got["engine"] in {e.url for e in fleet.engines}
    assert len(got["candidates"]) == 2


def test_metrics_pass_promtool(fleet: Fleet) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    out = subprocess.run(
        [promtool, "check", "metrics"],
        input=metrics_text(fleet.router).encode(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


# -- hot reload under load -------------------------------------------------------------------


async def _load(router: Proc, stop: asyncio.Event, results: list[int], limit: int = 400) -> None:
    """Four clients sending chat requests until ``stop`` (at most ``limit`` in all)."""
    async with aiohttp.ClientSession(router.url) as http:

        async def worker(w: int) -> None:
            while not stop.is_set() and len(results) < limit:
                body = chat_body(f"worker {w} request {len(results)}", stream=w % 2 == 0)
                async with http.post(CHAT, json=body) as resp:
                    data = await resp.read()
                    ok = resp.status == 200 and b'"error"' not in data
                    results.append(200 if ok else resp.status or 599)

        await asyncio.gather(*(worker(w) for w in range(4)))


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` atomically, as a ConfigMap update does: no reader sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _wait_metric(router: Proc, name: str, value: float, labels: dict[str, str]) -> None:
    async def reached() -> bool:
        got = await ametric(router, name, **labels)
        assert got >= value, f"{name}{labels} is {got}, not yet {value}"
        return True

    await eventually(reached, timeout=15)


async def test_hot_reload_under_load_all_succeed(fleet: Fleet) -> None:
    ok = {"result": "success"}
    bad = {"result": "error"}
    name = "kvrouter_policy_reloads_total"
    success0 = await ametric(fleet.router, name, **ok)
    error0 = await ametric(fleet.router, name, **bad)
    original = fleet.policy.read_text()
    stop = asyncio.Event()
    results: list[int] = []
    load = asyncio.create_task(_load(fleet.router, stop, results))
    try:
        await eventually(lambda: results or load.done())  # the load is running
        replace_file(fleet.policy, preset_path("least-load").read_text())
        await _wait_metric(fleet.router, name, success0 + 1, ok)
        replace_file(fleet.policy, "name: broken\nscorers: [{type: load, weight: -1}]\n")
        await _wait_metric(fleet.router, name, error0 + 1, bad)
        n = len(results)
        # Routing goes on under the old policy (unless the load already sent all it had to).
        await eventually(lambda: len(results) >= n + 8 or load.done())
        replace_file(fleet.policy, original)
        await _wait_metric(fleet.router, name, success0 + 2, ok)
        fleet.router.popen.send_signal(signal.SIGHUP)  # forces a reload of unchanged content
        await _wait_metric(fleet.router, name, success0 + 3, ok)
    finally:
        stop.set()
        await load
    assert len(results) >= 8
    assert set(results) == {200}, results
    assert await ametric(fleet.router, name, **bad) == error0 + 1
    async with aiohttp.ClientSession() as http, http.get(f"{fleet.router.url}/ready") as r:
        assert (await r.json())["policy"] == "kv-aware"
    assert_inflight_zero(fleet.router)


# -- an engine killed under load ------------------------------------------------------------


@dataclass
class Outcome:
    started: bool = False  # the client had received at least one event
    ok: bool = False


async def _stream_load(router: Proc, outcomes: list[Outcome], total: int, kill: Any) -> None:
    """Six clients, ``total`` streamed requests; ``kill`` runs once a third are done."""
    counter = iter(range(total))
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(router.url, timeout=timeout) as http:

        async def one(i: int) -> None:
            o = Outcome()
            outcomes.append(o)
            body = chat_body(f"load request {i}", stream=True, system=f"tenant {i % 5} " + SYSTEM)
            body["max_tokens"] = 6
            try:
                async with http.post(CHAT, json=body) as resp:
                    if resp.status != 200:
                        return
                    data = b""
                    async for chunk in resp.content.iter_any():
                        o.started = o.started or b"data:" in chunk
                        data += chunk
                    o.ok = data.endswith(b"data: [DONE]\n\n") and b'"error"' not in data
            except aiohttp.ClientError:
                pass

        async def worker() -> None:
            for i in counter:
                if i == total // 3:
                    kill()
                await one(i)

        await asyncio.gather(*(worker() for _ in range(6)))


async def test_engine_killed_under_load_no_unstarted_request_fails(
    procs: list[Proc], tmp_path: Path
) -> None:
    # Timed engines (about 50 tokens/s), so that requests are in flight when one dies.
    fleet = start_fleet(tmp_path, procs, n=3, engine_args=("--decode-tokens-per-s", "50"))
    victim = fleet.engines[0]
    outcomes: list[Outcome] = []
    await _stream_load(fleet.router, outcomes, 60, lambda: victim.popen.kill())
    assert not victim.alive()
    failed_unstarted = [o for o in outcomes if not o.ok and not o.started]
    assert failed_unstarted == []
    assert sum(o.ok for o in outcomes) >= 50
    wait_until(
        lambda: metric(fleet.router, "kvrouter_backend_healthy", backend=victim.url) == 0,
        "the dead backend ejected",
    )
    assert_inflight_zero(fleet.router)
    assert fleet.router.stop() == 0  # SIGTERM: a clean, graceful exit
    assert "Traceback" not in fleet.router.log()
