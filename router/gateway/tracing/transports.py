"""One export request to the collector: OTLP over gRPC (grpcio) or HTTP (the standard library).

Both send bytes router.gateway.tracing.otlp already wrote, so neither builds a message: gRPC
calls ``TraceService/Export`` with no serializer, HTTP posts ``application/x-protobuf``. A
failure is an ``ExportFailed`` that says whether OTLP calls it worth retrying (the collector
busy or away) or not (it refused the data). Blocking; called from the export thread only.
"""

from __future__ import annotations

import abc
import gzip
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from router.core.fields import ConfigError
from router.gateway.config.otlp_delivery import Delivery
from router.gateway.config.tracing import TraceExport

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# OTLP/gRPC's retryable codes; OTLP/HTTP's retryable statuses.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class ExportFailed(Exception):
    """An export that did not reach the collector, or that it refused."""

    def __init__(self, reason: str, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


class Transport(abc.ABC):
    """Sends one encoded ``ExportTraceServiceRequest``; ``close`` releases its connection."""

    @abc.abstractmethod
    def send(self, body: bytes, timeout: float) -> None:
        """Send ``body`` within ``timeout`` seconds; raises ``ExportFailed``."""

    def close(self) -> None:  # noqa: B027 (a transport with no connection has nothing to do)
        """Nothing to release by default."""


def _read(path: str, name: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"tracing: cannot read the {name} {path}: {e.strerror or e}") from None


class Grpc(Transport):
    """OTLP/gRPC: plaintext to ``http://``, TLS to ``https://`` (or no scheme, unless insecure)."""

    def __init__(self, endpoint: str, d: Delivery) -> None:
        url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        target = url.netloc or endpoint
        secure = url.scheme == "https" or (not url.scheme and not d.insecure)
        compression = grpc.Compression.Gzip if d.gzip else grpc.Compression.NoCompression
        if secure:
            credentials = grpc.ssl_channel_credentials(
                _read(d.certificate, "certificate"),
                _read(d.client_key, "client key"),
                _read(d.client_certificate, "client certificate"),
            )
            self._channel = grpc.secure_channel(target, credentials, compression=compression)
        else:
            self._channel = grpc.insecure_channel(target, compression=compression)
        # gRPC metadata keys are lowercase.
        self._metadata = tuple((k.lower(), v) for k, v in d.headers)
        self._export: Callable[..., bytes] = self._channel.unary_unary(EXPORT_METHOD)

    def send(self, body: bytes, timeout: float) -> None:
        try:
            self._export(body, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
            raise ExportFailed(f"gRPC {code.name}", code in RETRYABLE_CODES) from None

    def close(self) -> None:
        self._channel.close()


class Http(Transport):
    """OTLP/HTTP with protobuf bodies, to the endpoint's URL as given (…/v1/traces)."""

    def __init__(self, endpoint: str, d: Delivery) -> None:
        self._url, self._gzip = endpoint, d.gzip
        self._headers = {**dict(d.headers), "Content-Type": "application/x-protobuf"}
        if d.gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._tls: ssl.SSLContext | None = None
        if endpoint.startswith("https://"):
            try:
                self._tls = ssl.create_default_context(cafile=d.certificate or None)
                if d.client_certificate:
                    self._tls.load_cert_chain(d.client_certificate, d.client_key or None)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"tracing: the collector's TLS files: {e}") from None

    def send(self, body: bytes, timeout: float) -> None:
        data = gzip.compress(body, compresslevel=5) if self._gzip else body
        request = urllib.request.Request(self._url, data, self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._tls) as answer:
                answer.read()
        except urllib.error.HTTPError as e:
            e.close()
            raise ExportFailed(f"HTTP {e.code}", e.code in RETRYABLE_STATUSES) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise ExportFailed(f"unreachable: {reason}", True) from None


def transport(export: TraceExport) -> Transport:
    """The transport ``export``'s protocol names."""
    if export.protocol == "grpc":
        return Grpc(export.endpoint, export.delivery)
    return Http(export.endpoint, export.delivery)
