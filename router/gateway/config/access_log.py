"""The ``access_log`` section: one JSON line per request on standard error
(router.gateway.receipt), and which share of the successful ones is written.

``router.gateway.config.settings`` composes it into ``Config``; its docstring gives every
field with its default.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.fields import ConfigFields


@dataclass(frozen=True, slots=True)
class AccessLogSettings:
    enabled: bool = True
    # Share of answered requests written, from 0 to 1; a request that ends in an error (status
    # 400 and above, 499 when the client left) is written whatever the share, so sampling
    # never hides a failure.
    sample: float = 1.0


def access_log(f: ConfigFields | None) -> AccessLogSettings:
    """The ``access_log`` section, or its defaults when the file has none."""
    d = AccessLogSettings()
    if f is None:
        return d
    out = AccessLogSettings(f.flag("enabled", d.enabled), f.number("sample", d.sample, 0.0, 1.0))
    f.done()
    return out
