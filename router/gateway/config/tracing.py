"""The ``tracing`` section of the config file, and OpenTelemetry's standard variables over it.

What ``router.gateway.tracing`` exports is settled here, once, at start: the file's section gives
the defaults and a standard variable that is set wins over the field it stands for. One config
file (or one Helm release) then serves every environment, and what a platform injects into the
pod (an OpenTelemetry operator sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_SERVICE_NAME``)
takes effect without editing it:

    OTEL_SDK_DISABLED=true                  off, whatever else is set
    OTEL_TRACES_EXPORTER                    otlp: on; none: off; unset: ``enabled``
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT      the collector's URL, as given
    OTEL_EXPORTER_OTLP_ENDPOINT             its base URL (http/protobuf appends /v1/traces)
    OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL    grpc or http/protobuf; unset: ``protocol``
    OTEL_TRACES_SAMPLER                     the sampler by its standard name; unset: parent
                                            based, ``sample_ratio`` of new traces
    OTEL_TRACES_SAMPLER_ARG                 a ratio sampler's ratio; unset: ``sample_ratio``
    OTEL_SERVICE_NAME                       the resource's service.name; unset: ``service_name``

The exporter's and batching's own variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``,
...) are router.gateway.config.otlp_delivery's.

A value outside these is a ``ConfigError`` naming the variable: the router does not start on a
tracing setup it would silently ignore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.core.fields import ConfigError, ConfigFields
from router.gateway.config.otlp_delivery import Delivery, delivery, first_set

PROTOCOLS = ("grpc", "http/protobuf")
# The collector's usual address on each protocol (OpenTelemetry's defaults).
DEFAULT_ENDPOINTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}
HTTP_TRACES_PATH = "/v1/traces"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """OpenTelemetry traces of each request (router.gateway.tracing); off by default."""

    enabled: bool = False
    # The OTLP collector; empty: the standard variables, else the protocol's local default.
    endpoint: str = ""
    protocol: str = "grpc"
    # Share of new traces kept; a request whose client sent a traceparent follows its flag.
    sample_ratio: float = 1.0
    service_name: str = "kvrouter"


@dataclass(frozen=True, slots=True)
class TraceExport:
    """What is exported, where and how: the section with the environment applied."""

    endpoint: str
    protocol: str
    sampler: str  # one of SAMPLERS
    ratio: float
    service_name: str
    # Headers, TLS, timeouts and batching: router.gateway.config.otlp_delivery.
    delivery: Delivery = field(default_factory=Delivery)


def tracing(f: ConfigFields | None) -> TracingSettings:
    """The ``tracing`` section, or its defaults when the file has none."""
    d = TracingSettings()
    if f is None:
        return d
    out = TracingSettings(
        enabled=f.flag("enabled", d.enabled),
        endpoint=f.text("endpoint", d.endpoint),
        protocol=f.choice("protocol", d.protocol, PROTOCOLS),
        sample_ratio=f.number("sample_ratio", d.sample_ratio, 0.0, 1.0),
        service_name=f.text("service_name", d.service_name) or d.service_name,
    )
    f.done()
    return out


def export(settings: TracingSettings, environ: Mapping[str, str]) -> TraceExport | None:
    """The export ``settings`` and ``environ`` ask for; None: tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    name, exporter = first_set(environ, "OTEL_TRACES_EXPORTER")
    if exporter and exporter.lower() not in ("otlp", "none"):
        raise ConfigError(f"{name}={exporter!r}: kvrouter exports traces as otlp (or none)")
    if not (exporter.lower() == "otlp" if exporter else settings.enabled):
        return None
    name, protocol = first_set(
        environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    protocol = protocol or settings.protocol
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{name}={protocol!r}: give one of {', '.join(PROTOCOLS)}")
    endpoint = _endpoint(settings, environ, protocol)
    name, sampler = first_set(environ, "OTEL_TRACES_SAMPLER")
    ratio = settings.sample_ratio
    if sampler:
        sampler = sampler.lower()
        if sampler not in SAMPLERS:
            raise ConfigError(f"{name}={sampler!r}: give one of {', '.join(SAMPLERS)}")
        ratio = _ratio(environ, ratio) if sampler.endswith("traceidratio") else 1.0
    else:
        sampler = "parentbased_traceidratio"
    _, service = first_set(environ, "OTEL_SERVICE_NAME")
    service = service or settings.service_name
    return TraceExport(endpoint, protocol, sampler, ratio, service, delivery(environ))


def _endpoint(settings: TracingSettings, environ: Mapping[str, str], protocol: str) -> str:
    _, exact = first_set(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    _, base = first_set(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if exact:
        return exact
    if base:
        # The spec's signal path goes after the base URL for HTTP, never for gRPC.
        return base.rstrip("/") + HTTP_TRACES_PATH if protocol == "http/protobuf" else base
    if settings.endpoint:
        return settings.endpoint
    default = DEFAULT_ENDPOINTS[protocol]
    return default + HTTP_TRACES_PATH if protocol == "http/protobuf" else default


def _ratio(environ: Mapping[str, str], default: float) -> float:
    name, arg = first_set(environ, "OTEL_TRACES_SAMPLER_ARG")
    if not arg:
        return default
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"{name}={arg!r}: a ratio from 0 to 1")
    return ratio
