"""vLLM's metric names, read from the engine at scrape time."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from router.core.engine_model import EngineSpec
from router.enginesim.engine import Engine, SimSettings
from router.enginesim.metrics import registry_for
from router.enginesim.requests import Endpoint, parse_generation
from tests.enginesim.support import MODEL, completion, prompt, raw


def scrape(engine: Engine) -> dict[str, Sample]:
    text = generate_latest(registry_for(engine)).decode()
    return {
        s.name: s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:")
    }


def test_metrics_vllm_names_with_model_label_follow_counters() -> None:
    engine = Engine(SimSettings(spec=EngineSpec(block_tokens=4), fast=True))
    for _ in range(2):
        gen = parse_generation(raw(completion(prompt(20))), Endpoint.COMPLETIONS, engine.settings)
        ticket = engine.admit(gen.keys, gen.prompt_tokens, 5)
        ticket.emitted = 5
        engine.release(ticket)
    samples = scrape(engine)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
    ):
        assert samples[name].labels == {"model_name": MODEL}, name
    assert samples["vllm:prefix_cache_queries_total"].value == 40
    assert samples["vllm:prefix_cache_hits_total"].value == 19
    assert samples["vllm:generation_tokens_total"].value == 10
    assert samples["vllm:request_success_total"].value == 2
    assert samples["vllm:num_requests_running"].value == 0
    # Nothing runs: the cached blocks are reusable, not in use (vLLM counts them free).
    assert samples["vllm:kv_cache_usage_perc"].value == 0


def test_metrics_running_gauge_counts_inflight() -> None:
    engine = Engine(SimSettings(fast=True))
    ticket = engine.admit((), 10, 1)
    assert scrape(engine)["vllm:num_requests_running"].value == 1
    engine.release(ticket)
    assert scrape(engine)["vllm:num_requests_running"].value == 0
