"""Engines' own load: parsing their /metrics, and the scraper that feeds the routing core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.decision import RoutingCore
from router.core.load import EngineReport
from router.gateway.config.engines import EngineMetricsSettings, MetricNames
from router.gateway.config.settings import load_config_text
from router.gateway.fleet.scrape import (
    CAPACITY_REFRESH_SECONDS,
    MAX_REQUESTS,
    EngineMetricsScraper,
    MetricsParseError,
    parse_capacity,
    parse_report,
)
from router.gossip.clock import ManualClock
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.fakes import FakeEngine, FakeUpstream
from tests.gateway.integration import ADMIN, ADMIN_ENV
from tests.support import Proc, http_json, metric, running, start_kvrouter, wait_until

# Written from the engines' documented metric names, in the shape their servers print them.
VLLM = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.61
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 42.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
"""

VLLM_OLD = b"""\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.97
"""

SGLANG = b"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen/Qwen2.5-7B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen/Qwen2.5-7B-Instruct"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen/Qwen2.5-7B-Instruct"} 0.28
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="qwen/Qwen2.5-7B-Instruct"} 811.5
"""

LLAMACPP = b"""\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 3122
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(VLLM, EngineReport(12, 3, 0.61), id="vllm-data-parallel-ranks-summed"),
        pytest.param(VLLM_OLD, EngineReport(3, 0, 0.97), id="vllm-older-kv-name"),
        pytest.param(SGLANG, EngineReport(12, 4, 0.28), id="sglang"),
        pytest.param(LLAMACPP, EngineReport(2, 3, 0.125), id="llamacpp"),
        pytest.param(VLLM.replace(b"\n", b"\r\n"), EngineReport(12, 3, 0.61), id="crlf"),
    ],
)
def test_parse_report_known_engines_reads_their_load(body: bytes, expected: EngineReport) -> None:
    assert parse_report(body) == expected


def test_parse_report_configured_names_read_other_engines() -> None:
    body = b"# TYPE tgi_queue_size gauge\ntgi_queue_size 9\ntgi_batch_current_size 4\n"
    names = MetricNames(running=("tgi_batch_current_size",), waiting=("tgi_queue_size",))
    assert parse_report(body, names) == EngineReport(4, 9, 0.0)
    with pytest.raises(MetricsParseError, match="no running or waiting"):
        parse_report(body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b"vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\n",
            EngineReport(0, 2, 0.0),
            id="nan-ignored",
        ),
        pytest.param(
            b"vllm:num_requests_running 1e300\nvllm:num_requests_waiting -5\n"
            b"vllm:kv_cache_usage_perc 7\n",
            EngineReport(MAX_REQUESTS, 0, 1.0),
            id="huge-and-negative-clamped",
        ),
        pytest.param(
            b"vllm:num_requests_running +Inf\nvllm:num_requests_waiting 1\n",
            EngineReport(0, 1, 0.0),
            id="inf-ignored",
        ),
    ],
)
def test_parse_report_odd_values_bounded(body: bytes, expected: EngineReport) -> None:
    assert parse_report(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"<html>502 Bad Gateway</html>", id="html"),
        pytest.param(b'vllm:num_requests_running{model_name="m 3\n', id="broken-labels"),
        pytest.param(b"vllm:num_requests_running three\n", id="word-value"),
        pytest.param(b"\xff\xfe\x00garbage\n" * 1000, id="binary"),
    ],
)
def test_parse_report_garbage_parse_error(body: bytes) -> None:
    with pytest.raises(MetricsParseError):
        parse_report(body)


@given(st.binary(max_size=2000))
def test_parse_report_any_bytes_report_or_parse_error(body: bytes) -> None:
    try:
        r = parse_report(VLLM[:200] + body)
    except MetricsParseError:
        return
    assert r.running >= 0 and r.waiting >= 0 and 0.0 <= r.kv_usage <= 1.0


def test_config_engine_metrics_section_parsed_and_checked() -> None:
    cfg = load_config_text(
        "engine_metrics: {interval_seconds: 1, timeout_seconds: 0.5, stale_after_intervals: 3,"
        " names: {waiting: [tgi_queue_size]}}\n",
        "c.yaml",
    )
    em = cfg.engine_metrics
    assert em.enabled and em.interval_seconds == 1.0 and em.stale_after_seconds == 3.0
    assert em.names.waiting == ("tgi_queue_size",)
    assert em.names.running == MetricNames().running
    with pytest.raises(ValueError, match=r"engine_metrics\.names\.running"):
        load_config_text("engine_metrics: {names: {running: [1]}}\n", "c.yaml")
    with pytest.raises(ValueError, match=r"engine_metrics\.interval"):
        load_config_text("engine_metrics: {interval: 1}\n", "c.yaml")


# -- the engine's cache size -----------------------------------------------------------------

VLLM_INFO = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="661",engine="0"} 1.0\n'


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        pytest.param(VLLM_INFO.encode(), 661 * 16, id="vllm-blocks-by-block-size"),
        pytest.param(
            b'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="10576",'
            b'num_gpu_blocks="661"} 1\n',
            10576,
            id="vllm-size-in-tokens-wins",
        ),
        pytest.param(
            (VLLM_INFO + VLLM_INFO.replace('engine="0"', 'engine="1"')).encode(),
            2 * 661 * 16,
            id="vllm-data-parallel-ranks-add-up",
        ),
        pytest.param(b"sglang:max_total_num_tokens 471258.0\n", 471258, id="sglang"),
        pytest.param(
            b'dynamo_frontend_model_total_kv_blocks{model="m"} 800\n'
            b'dynamo_frontend_model_kv_cache_block_size{model="m"} 16\n',
            12800,
            id="dynamo-frontend",
        ),
        pytest.param(VLLM, None, id="no-size-series"),
        pytest.param(b'vllm:cache_config_info{num_gpu_blocks="None"} 1\n', None, id="vllm-unset"),
        pytest.param(b"sglang:max_total_num_tokens 1e15\n", None, id="nonsense-size"),
        pytest.param(b"\x00\xff{{{ not metrics", None, id="garbage"),
    ],
)
def test_parse_capacity_reads_what_each_engine_exports(body: bytes, tokens: int | None) -> None:
    assert parse_capacity(body) == tokens


@given(st.binary(max_size=512))
def test_parse_capacity_any_bytes_a_size_or_none(body: bytes) -> None:
    got = parse_capacity(body)
    assert got is None or got > 0


async def test_scraper_learns_each_engines_cache_size_and_reads_it_again_later() -> None:
    clock = ManualClock(10.0)
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    core.set_engines({A: 1, B: 1})
    a = FakeEngine(A, metrics=(200, VLLM + VLLM_INFO.encode()))
    up = FakeUpstream(a, FakeEngine(B, metrics=(200, VLLM)))
    sized: list[tuple[str, int]] = []

    def size(url: str, tokens: int) -> None:
        sized.append((url, tokens))
        core.engine_capacity(url, tokens)

    scraper = EngineMetricsScraper(
        EngineMetricsSettings(), up, lambda: [A, B], core.loads.engine_report,
        clock=clock, capacity=size,
    )  # fmt: skip
    await scraper.scrape_all()
    await scraper.scrape_all()  # within the refresh period: not read again
    assert sized == [(A, 661 * 16)]
    block_tokens = core.policy.block_tokens
    assert core.index.capacity_blocks(A) == 661 * 16 // block_tokens
    assert core.index.capacity_blocks(B) == core.policy.engine_capacity_blocks  # the policy's
    a.metrics = (200, VLLM + VLLM_INFO.replace("661", "1322").encode())  # restarted, larger
    await clock.advance(CAPACITY_REFRESH_SECONDS)
    await scraper.scrape_all()
    assert sized[-1] == (A, 1322 * 16)
    off = EngineMetricsScraper(
        EngineMetricsSettings(learn_capacity=False), up, lambda: [A], core.loads.engine_report,
        clock=clock, capacity=size,
    )  # fmt: skip
    await off.scrape_all()
    assert len(sized) == 2


# -- the scraper -----------------------------------------------------------------------------

A, B = "http://a:1", "http://b:1"


async def test_scraper_reports_reach_the_core_and_failures_are_counted() -> None:
    clock = ManualClock(10.0)
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    a = FakeEngine(A, metrics=(200, VLLM))
    b = FakeEngine(B, metrics=(200, b"not metrics"))
    up = FakeUpstream(a, b, FakeEngine("http://c:1", down=True))
    counted: list[str] = []
    scraper = EngineMetricsScraper(
        EngineMetricsSettings(),
        up,
        lambda: [A, B, "http://c:1", "http://d:1"],
        core.loads.engine_report,
        clock=clock,
        count=counted.append,
    )
    await scraper.scrape_all()
    assert sorted(counted) == ["error", "error", "ok", "parse_error"]
    assert core.loads.engine_reported(A, 10.1) == EngineReport(12, 3, 0.61)
    assert core.loads.engine_reported(B, 10.1) is None
    assert core.loads.requests([A, B], now=10.1) == [15, 0]
    b.metrics = (503, b"")
    await scraper.scrape(B)
    assert counted[-1] == "status"


async def test_scraper_disabled_returns_at_once() -> None:
    up = FakeUpstream(FakeEngine(A, metrics=(200, VLLM)))
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    scraper = EngineMetricsScraper(
        EngineMetricsSettings(enabled=False), up, lambda: [A], core.loads.engine_report
    )
    await scraper.run()
    assert core.loads.reporting_engines() == ()


# -- live: kvrouter serve in front of engine-sim processes -----------------------------------

LIVE_CONFIG = """
policy: kv-aware
health: {interval_seconds: 0.2, timeout_seconds: 2}
engine_metrics: {interval_seconds: 0.1, timeout_seconds: 1, stale_after_intervals: 50}
"""


def _stats(engine: Proc) -> dict[str, Any]:
    result: dict[str, Any] = http_json(f"{engine.url}/stats")
    return result


def _waiting_reported(router: Proc, engine: Proc) -> float:
    try:
        return metric(
            router, "kvrouter_backend_reported_requests", backend=engine.url, state="waiting"
        )
    except (KeyError, ValueError, LookupError):
        return -1.0


@pytest.mark.integration
def test_live_engine_reporting_50_waiting_gets_nothing_new_while_peers_are_free(
    tmp_path: Path,
) -> None:
    with running([]) as procs:
        engines = [start_kvrouter(["engine-sim", "--fast"], tmp_path) for _ in range(3)]
        procs.extend(engines)
        config = tmp_path / "serve.yaml"
        config.write_text(LIVE_CONFIG)
        args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
        for e in engines:
            args += ["--backend", e.url]
        router = start_kvrouter(args, tmp_path, ready_path="/ready")
        procs.append(router)
        busy, *free = engines
        http_json(f"{busy.url}/load", {"waiting": 50})
        wait_until(lambda: _waiting_reported(router, busy) == 50, "the router sees 50 waiting")

        def ask(i: int) -> None:
            body = {"model": "sim-model", "prompt": f"question {i} " * 200, "max_tokens": 2}
            http_json(f"{router.url}/v1/completions", body)

        for i in range(12):
            ask(i)
        assert _stats(busy)["requests"] == 0  # this router never sent it anything either
        assert sum(_stats(e)["requests"] for e in free) == 12

        # Once it reports an empty queue it takes work again (bounded: 30 more requests).
        http_json(f"{busy.url}/load", {"waiting": 0})
        wait_until(lambda: _waiting_reported(router, busy) == 0, "the queue reported empty")
        for i in range(12, 42):
            ask(i)
            if _stats(busy)["requests"]:
                break
        assert _stats(busy)["requests"] > 0
        assert router.stop() == 0


@pytest.mark.integration
def test_live_index_capacity_is_each_engines_own(tmp_path: Path) -> None:
    with running([]) as procs:
        sizes = (8192, 32768)
        engines = [
            start_kvrouter(["engine-sim", "--fast", "--kv-capacity-tokens", str(n)], tmp_path)
            for n in sizes
        ]
        procs.extend(engines)
        config = tmp_path / "serve.yaml"
        config.write_text(LIVE_CONFIG)
        args = ["serve", "--config", str(config), "--host", "127.0.0.1"]
        for e in engines:
            args += ["--engine", e.url]
        router = start_kvrouter(args, tmp_path, ready_path="/ready", env=ADMIN_ENV)
        procs.append(router)
        block_tokens = load_policy(preset_path("kv-aware")).block_tokens

        def capacities() -> list[int]:
            backends = http_json(f"{router.url}/debug/backends", headers=ADMIN)["backends"]
            by_url = {b["url"]: b["index_capacity_blocks"] for b in backends}
            return [by_url[e.url] for e in engines]

        wanted = [n // block_tokens for n in sizes]
        wait_until(lambda: capacities() == wanted, "each engine's own cache size in the index")
        assert router.stop() == 0
