"""``engines.pods``: engines found as the Kubernetes pods a label selector picks.

Every pod the selector picks in ``namespace`` that is Ready and has an IP is an engine
``scheme://POD_IP:port`` (router.gateway.fleet.pods watches them). An empty ``selector`` means
no pod discovery; an empty ``namespace`` is the pod's own (its service account's namespace
file), else ``default``. Only equality selectors (``key=value`` joined by commas) are taken:
what an InferencePool's selector can say.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from router.core.fields import ConfigError, ConfigFields

SCHEMES = ("http", "https")
# A label key (optionally prefixed, as in app.kubernetes.io/name) and value.
_LABEL = re.compile(r"^([a-zA-Z0-9]([\w.-]*[a-zA-Z0-9])?/)?[a-zA-Z0-9]([\w.-]*[a-zA-Z0-9])?$")


@dataclass(frozen=True, slots=True)
class PodEngines:
    """The pods ``selector`` picks in ``namespace``, as engines on ``port``."""

    selector: str
    namespace: str = ""
    port: int = 8000
    scheme: str = "http"

    def labels(self) -> dict[str, str]:
        return labels_of(self.selector)


def labels_of(selector: str) -> dict[str, str]:
    """``a=b,c=d`` -> {a: b, c: d}; raises ``ValueError`` saying what is not understood."""
    out: dict[str, str] = {}
    for part in selector.split(","):
        key, sep, value = part.strip().partition("=")
        key, value = key.strip(), value.strip().removeprefix("=")
        if not sep or not _LABEL.match(key) or (value and not _LABEL.match(value)):
            raise ValueError(f"must be key=value labels joined by commas, got {selector!r}")
        out[key] = value
    return out


def pod_engines(f: ConfigFields | None) -> PodEngines | None:
    if f is None:
        return None
    d = PodEngines(selector="")
    out = PodEngines(
        selector=f.text("selector", d.selector),
        namespace=f.text("namespace", d.namespace),
        port=f.integer("port", d.port, 1, 65535),
        scheme=f.choice("scheme", d.scheme, SCHEMES),
    )
    f.done()
    if not out.selector:
        return None  # the chart's default: no pod discovery
    try:
        out.labels()
    except ValueError as e:
        f.fail(f.at("selector"), str(e))
    return out


def with_pods(pods: PodEngines | None, selector: str | None, port: int | None) -> PodEngines | None:
    """``pods`` with ``--engine-pods`` and ``--engine-pods-port`` applied."""
    if selector:
        try:
            labels_of(selector)
        except ValueError as e:
            raise ConfigError(f"--engine-pods: {e}") from None
        pods = dataclasses.replace(pods or PodEngines(selector), selector=selector)
    if port is not None and pods is not None:
        pods = dataclasses.replace(pods, port=port)
    return pods
