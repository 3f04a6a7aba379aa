"""engine-sim's ``/metrics``: vLLM's metric names, read from the engine at scrape time.

Dashboards and load probes written for vLLM read engine-sim unchanged: the same names, labelled
``model_name``. Each app owns its registry, so several engines in one process (tests) never
share a counter. What vLLM has no name for, a disaggregated engine's paths and transfers, is
under ``enginesim:``: requests by path (``enginesim:pd_requests{path}``: whole,
prefilled-for-remote, decoded-from-remote), KV moved in (``enginesim:kv_transfer_tokens``,
``_bytes``, ``_seconds`` of simulated link time), failed transfers and the role
(``enginesim:role_info{role}``, value 1).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.enginesim.engine import Engine


class EngineCollector(Collector):
    """vLLM's gauges and counters for one engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        e = self._engine
        running, waiting = e.load()
        usage = e.cache_usage()
        c = e.counters
        gauges = (
            ("vllm:num_requests_running", "Requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage (older vLLM name).", usage),
        )
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", c.prompt_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", c.cached_tokens),
            ("vllm:prompt_tokens", "Prefill tokens processed.", c.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens processed.", c.completion_tokens),
            ("vllm:request_success", "Requests admitted.", c.requests),
        )
        labels = ["model_name"]
        model = [e.settings.model]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(model, value)
            yield g
        for name, doc, value in counters:
            m = CounterMetricFamily(name, doc, labels=labels)
            m.add_metric(model, value)
            yield m
        # vLLM's info gauge: the cache's shape in its labels, value 1.
        spec = e.settings.spec
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            labels=["block_size", "num_gpu_blocks"],
        )
        info.add_metric([str(spec.block_tokens), str(spec.capacity_tokens // spec.block_tokens)], 1)
        yield info
        yield from self._disaggregation(model)

    def _disaggregation(self, model: list[str]) -> Iterable[Metric]:
        c = self._engine.counters
        paths = CounterMetricFamily(
            "enginesim:pd_requests",
            "Generation requests by their path through a disaggregated fleet.",
            labels=["model_name", "path"],
        )
        for path, value in (
            ("whole", c.whole),
            ("prefilled-for-remote", c.prefilled_for_remote),
            ("decoded-from-remote", c.decoded_from_remote),
        ):
            paths.add_metric([*model, path], value)
        yield paths
        moved: tuple[tuple[str, str, float], ...] = (
            (
                "enginesim:kv_transfer_tokens",
                "Prompt tokens whose KV was moved in.",
                c.transferred_tokens,
            ),
            ("enginesim:kv_transfer_bytes", "KV bytes moved in.", c.transferred_bytes),
            (
                "enginesim:kv_transfer_seconds",
                "Simulated link time of the KV moved in.",
                c.transfer_seconds,
            ),
            ("enginesim:kv_transfer_failures", "KV transfers that failed.", c.transfer_failures),
        )
        for name, doc, amount in moved:
            m = CounterMetricFamily(name, doc, labels=["model_name"])
            m.add_metric(model, amount)
            yield m
        role = GaugeMetricFamily(
            "enginesim:role_info", "The engine's role in a disaggregated fleet.", labels=["role"]
        )
        role.add_metric([self._engine.settings.roles.role], 1)
        yield role


def registry_for(engine: Engine) -> CollectorRegistry:
    """A registry of its own holding ``engine``'s collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry
