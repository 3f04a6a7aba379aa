"""The chart's ``router.tracing`` values reach the router's ``tracing`` section."""

from __future__ import annotations

import helm_python
import pytest

from router.gateway.config.settings import load_config_text
from router.gateway.config.tracing import TracingSettings
from tests.chart.support import merged_values, render, rendered


def test_tracing_chart_defaults_are_the_router_defaults() -> None:
    d = TracingSettings()
    assert merged_values({})["router"]["tracing"] == {
        "enabled": d.enabled,
        "endpoint": d.endpoint,
        "protocol": d.protocol,
        "sampleRatio": d.sample_ratio,
        "serviceName": d.service_name,
    }
    config = load_config_text(rendered("defaults").router_config_text(), "config.yaml")
    assert config.tracing == d


def test_tracing_chart_values_are_what_the_router_loads() -> None:
    out = render(
        {
            "router": {
                "tracing": {
                    "enabled": True,
                    "endpoint": "http://otel-collector.observability:4317",
                    "sampleRatio": 0.01,
                    "serviceName": "kvrouter-eu",
                }
            }
        }
    )
    config = load_config_text(out.router_config_text(), "config.yaml")
    assert config.tracing == TracingSettings(
        True, "http://otel-collector.observability:4317", "grpc", 0.01, "kvrouter-eu"
    )


@pytest.mark.parametrize(
    ("tracing", "where"),
    [
        ({"protocol": "http/json"}, "/router/tracing/protocol"),
        ({"sampleRatio": 1.5}, "/router/tracing/sampleRatio"),
        ({"sampler": "always_on"}, "sampler"),
    ],
    ids=["protocol-unknown", "ratio-above-one", "unknown-key"],
)
def test_tracing_chart_bad_value_rejected_naming_the_key(
    tracing: dict[str, object], where: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"router": {"tracing": tracing}})
    assert where in str(err.value)
