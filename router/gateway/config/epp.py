"""The ``epp`` section of the config file: the endpoint picker an Envoy-based gateway asks.

``port`` (0: off) serves Envoy's ``envoy.service.ext_proc.v3.ExternalProcessor`` and gRPC
health on ``listen.host`` (router.gateway.extproc); ``proxy: false`` leaves the HTTP port
with health, readiness, metrics and admin only, for a deployment where Envoy is the data
plane and this process only decides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from router.core.fields import ConfigError, ConfigFields


@dataclass(frozen=True, slots=True)
class EppSettings:
    """The endpoint picker's port (0: none) and whether the HTTP proxy serves too."""

    port: int = 0
    proxy: bool = True

    @property
    def enabled(self) -> bool:
        return self.port != 0


def epp(f: ConfigFields | None) -> EppSettings:
    d = EppSettings()
    if f is None:
        return d
    out = EppSettings(f.integer("port", d.port, 0, 65535), f.flag("proxy", d.proxy))
    f.done()
    return out


def with_epp(settings: EppSettings, port: int | None, no_proxy: bool) -> EppSettings:
    """``settings`` with ``--epp-port`` and ``--no-proxy`` applied."""
    if port is not None:
        settings = dataclasses.replace(settings, port=port)
    if no_proxy:
        settings = dataclasses.replace(settings, proxy=False)
    return settings


def check_epp(settings: EppSettings, api_port: int) -> None:
    """Raises ``ConfigError`` for a picker that cannot serve as configured."""
    if not settings.proxy and not settings.enabled:
        raise ConfigError("epp.proxy: false (--no-proxy) needs epp.port (--epp-port) set")
    if settings.enabled and settings.port == api_port:
        raise ConfigError("epp.port: must differ from the API port")
