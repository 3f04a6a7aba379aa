"""The exporter's and batching's OTEL_* variables: OpenTelemetry's meanings, or refused."""

from __future__ import annotations

import pytest

from router.core.fields import ConfigError
from router.gateway.config.otlp_delivery import Delivery, delivery
from router.gateway.config.tracing import TracingSettings, export


def test_otlp_delivery_defaults_are_opentelemetrys() -> None:
    d = delivery({})
    assert d == Delivery()
    assert (d.timeout, d.schedule_delay, d.max_queue, d.max_batch, d.export_timeout) == (
        10.0,
        5.0,
        2048,
        512,
        30.0,
    )


def test_otlp_delivery_reads_every_variable_the_traces_one_first() -> None:
    d = delivery(
        {
            "OTEL_EXPORTER_OTLP_HEADERS": "x-general=1",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=a%20b, x-team = infra ,",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "GZIP",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/etc/key.pem",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/cert.pem",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
            "OTEL_BSP_EXPORT_TIMEOUT": "1000",
            "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=router-0,deployment.environment=prod",
        }
    )
    assert d == Delivery(
        headers=(("api-key", "a b"), ("x-team", "infra")),
        timeout=2.5,
        gzip=True,
        insecure=True,
        certificate="/etc/ca.pem",
        client_key="/etc/key.pem",
        client_certificate="/etc/cert.pem",
        schedule_delay=0.05,
        max_queue=100,
        max_batch=10,
        export_timeout=1.0,
        resource=(("k8s.pod.name", "router-0"), ("deployment.environment", "prod")),
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "=value"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "-1"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "yes"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "many"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096"),  # above the queue
        ("OTEL_RESOURCE_ATTRIBUTES", "a=1,broken"),
    ],
)
def test_otlp_delivery_refuses_a_value_it_cannot_honour(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        export(TracingSettings(enabled=True), {variable: value})


def test_otlp_delivery_is_not_read_when_tracing_is_off() -> None:
    assert export(TracingSettings(), {"OTEL_BSP_MAX_QUEUE_SIZE": "0"}) is None
