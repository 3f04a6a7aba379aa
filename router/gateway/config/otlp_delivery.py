"""How spans are delivered to the collector: OpenTelemetry's exporter and batching variables.

The router exports its own spans (router.gateway.tracing.export), so it reads the variables the
SDK's OTLP exporter and batch processor would have read, with their meanings and defaults:

    OTEL_EXPORTER_OTLP[_TRACES]_HEADERS         key=value,... sent with each export (values
                                                percent-decoded): a collector's API key
    OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT         ms an export may take (10000)
    OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION     gzip or none
    OTEL_EXPORTER_OTLP[_TRACES]_INSECURE        gRPC to an endpoint with no scheme: plaintext
    OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE     the collector's CA (PEM file); unset: the system's
    OTEL_EXPORTER_OTLP[_TRACES]_CLIENT_KEY      mutual TLS: this process's key and certificate
    OTEL_EXPORTER_OTLP[_TRACES]_CLIENT_CERTIFICATE
    OTEL_BSP_SCHEDULE_DELAY                     ms between exports (5000)
    OTEL_BSP_MAX_QUEUE_SIZE                     spans held at most; more are dropped (2048)
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE              spans per export at most (512)
    OTEL_BSP_EXPORT_TIMEOUT                     ms an export may take with its retries (30000)
    OTEL_RESOURCE_ATTRIBUTES                    key=value,... on the resource (service.name from
                                                OTEL_SERVICE_NAME or the config still wins)

A malformed value is a ``ConfigError`` naming the variable, as in router.gateway.config.tracing.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from router.core.fields import ConfigError

COMPRESSIONS = ("gzip", "none")


@dataclass(frozen=True, slots=True)
class Delivery:
    """The transport's and the batching's settings; the defaults are OpenTelemetry's."""

    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 10.0
    gzip: bool = False
    # None: decided by the endpoint's scheme (http: plaintext, https or none: TLS).
    insecure: bool | None = None
    certificate: str = ""
    client_key: str = ""
    client_certificate: str = ""
    schedule_delay: float = 5.0
    max_queue: int = 2048
    max_batch: int = 512
    export_timeout: float = 30.0
    resource: tuple[tuple[str, str], ...] = ()


_DEFAULT = Delivery()


def first_set(environ: Mapping[str, str], *names: str) -> tuple[str, str]:
    """The first of ``names`` that is set and not blank, and its value; ("", "") if none."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return "", ""


def _otlp(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    """The traces-only exporter variable if set, else the general one."""
    return first_set(environ, f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}")


def pairs(name: str, value: str) -> tuple[tuple[str, str], ...]:
    """``key=value,...`` (W3C baggage's form, as the OTEL_* lists are written), decoded."""
    out = []
    for item in value.split(","):
        if not item.strip():
            continue
        key, eq, v = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{name}: {item.strip()!r} is not key=value")
        out.append((urllib.parse.unquote(key.strip()), urllib.parse.unquote(v.strip())))
    return tuple(out)


def _millis(name: str, raw: str, default: float) -> float:
    """Seconds from the variable ``name``'s value in milliseconds."""
    if not raw:
        return default
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if ms < 0:
        raise ConfigError(f"{name}={raw!r}: milliseconds, 0 or more")
    return ms / 1000


def _count(environ: Mapping[str, str], name: str, default: int) -> int:
    _, raw = first_set(environ, name)
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r}: a whole number, 1 or more")
    return int(raw)


def delivery(environ: Mapping[str, str]) -> Delivery:
    """The delivery ``environ`` asks for."""
    name, raw = _otlp(environ, "HEADERS")
    headers = pairs(name, raw) if raw else ()
    name, compression = _otlp(environ, "COMPRESSION")
    if compression and compression.lower() not in COMPRESSIONS:
        raise ConfigError(f"{name}={compression!r}: give gzip or none")
    name, insecure = _otlp(environ, "INSECURE")
    if insecure and insecure.lower() not in ("true", "false"):
        raise ConfigError(f"{name}={insecure!r}: give true or false")
    max_queue = _count(environ, "OTEL_BSP_MAX_QUEUE_SIZE", _DEFAULT.max_queue)
    max_batch = _count(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _DEFAULT.max_batch)
    if max_batch > max_queue:
        raise ConfigError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={max_batch} is above "
            f"OTEL_BSP_MAX_QUEUE_SIZE={max_queue}"
        )
    _, resource = first_set(environ, "OTEL_RESOURCE_ATTRIBUTES")
    return Delivery(
        headers=headers,
        timeout=_millis(*_otlp(environ, "TIMEOUT"), _DEFAULT.timeout),
        gzip=compression.lower() == "gzip",
        insecure=insecure.lower() == "true" if insecure else None,
        certificate=_otlp(environ, "CERTIFICATE")[1],
        client_key=_otlp(environ, "CLIENT_KEY")[1],
        client_certificate=_otlp(environ, "CLIENT_CERTIFICATE")[1],
        schedule_delay=_millis(
            *first_set(environ, "OTEL_BSP_SCHEDULE_DELAY"), _DEFAULT.schedule_delay
        ),
        max_queue=max_queue,
        max_batch=max_batch,
        export_timeout=_millis(
            *first_set(environ, "OTEL_BSP_EXPORT_TIMEOUT"), _DEFAULT.export_timeout
        ),
        resource=pairs("OTEL_RESOURCE_ATTRIBUTES", resource) if resource else (),
    )
