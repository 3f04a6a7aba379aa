"""The ``tracing`` section and the standard OTEL_* variables over it: who wins, what is refused."""

from __future__ import annotations

import pytest

from router.core.fields import ConfigError
from router.gateway.config.settings import load_config_text
from router.gateway.config.tracing import TraceExport, TracingSettings, export

ON = TracingSettings(enabled=True)
CASES = [
    pytest.param(TracingSettings(), {}, None, id="off-by-default"),
    pytest.param(
        ON,
        {},
        TraceExport("http://localhost:4317", "grpc", "parentbased_traceidratio", 1.0, "kvrouter"),
        id="on-with-defaults",
    ),
    pytest.param(
        TracingSettings(),
        {"OTEL_TRACES_EXPORTER": "otlp"},
        TraceExport("http://localhost:4317", "grpc", "parentbased_traceidratio", 1.0, "kvrouter"),
        id="exporter-variable-turns-it-on",
    ),
    pytest.param(ON, {"OTEL_TRACES_EXPORTER": "none"}, None, id="exporter-none-turns-it-off"),
    pytest.param(
        ON, {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None, id="sdk-disabled"
    ),
    pytest.param(
        TracingSettings(True, "http://file:4317", "grpc", 0.25, "from-file"),
        {},
        TraceExport("http://file:4317", "grpc", "parentbased_traceidratio", 0.25, "from-file"),
        id="file-fields-when-no-variable",
    ),
    pytest.param(
        TracingSettings(True, "http://file:4317", "grpc", 0.25, "from-file"),
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317",
            "OTEL_SERVICE_NAME": "from-env",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
        },
        TraceExport("http://env:4317", "grpc", "traceidratio", 0.5, "from-env"),
        id="variables-win-over-the-file",
    ),
    pytest.param(
        TracingSettings(True, sample_ratio=0.1),
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"},
        TraceExport("http://localhost:4317", "grpc", "parentbased_traceidratio", 0.1, "kvrouter"),
        id="sampler-without-arg-keeps-the-file-ratio",
    ),
    pytest.param(
        ON,
        {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
        TraceExport("http://localhost:4317", "grpc", "always_on", 1.0, "kvrouter"),
        id="arg-ignored-by-non-ratio-sampler",
    ),
    pytest.param(
        ON,
        {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/",
        },
        TraceExport(
            "http://c:4318/v1/traces", "http/protobuf", "parentbased_traceidratio", 1.0, "kvrouter"
        ),
        id="http-base-endpoint-gets-the-signal-path",
    ),
    pytest.param(
        ON,
        {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318",
        },
        TraceExport(
            "http://c:4318/custom", "http/protobuf", "parentbased_traceidratio", 1.0, "kvrouter"
        ),
        id="signal-specific-variables-win",
    ),
]


@pytest.mark.parametrize(("settings", "environ", "expected"), CASES)
def test_export_settings_and_environment(
    settings: TracingSettings, environ: dict[str, str], expected: TraceExport | None
) -> None:
    assert export(settings, environ) == expected


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ],
    ids=["exporter", "protocol", "sampler", "arg-not-a-number", "arg-above-one"],
)
def test_export_bad_variable_refused_naming_it(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        export(ON, environ)


def test_tracing_section_parsed_strictly() -> None:
    cfg = load_config_text("tracing: {enabled: true, sample_ratio: 0.01}\n", "c.yaml")
    assert cfg.tracing == TracingSettings(enabled=True, sample_ratio=0.01)
    with pytest.raises(ConfigError, match=r"tracing\.sample_ratio"):
        load_config_text("tracing: {sample_ratio: 2}\n", "c.yaml")
    with pytest.raises(ConfigError, match=r"tracing\.protocol"):
        load_config_text("tracing: {protocol: http/json}\n", "c.yaml")
    with pytest.raises(ConfigError, match=r"tracing\.sampler"):
        load_config_text("tracing: {sampler: always_on}\n", "c.yaml")
