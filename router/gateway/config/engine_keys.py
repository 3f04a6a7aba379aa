"""The API key each engine is sent, for engines that demand one (``vllm serve --api-key``).

Keys never appear in the config file: it names environment variables (mounted from a
Kubernetes Secret), per static engine (``engines.static: [{url, api_key_env}]``), for the
engines a DNS rule finds (``engines.dns.api_key_env``) and for every engine without its own
(``engines.api_key_env``). They are read once, at start; a named variable that is unset or
empty stops the start with a ``ConfigError`` naming the variable, never the value.

The upstream (router.gateway.upstream.client) puts ``Authorization: Bearer KEY`` on every call to
such an engine: proxied requests (replacing whatever the client sent), health probes, model lists
and metrics scrapes. Engines without a key get no Authorization header from the gateway itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.core.fields import ConfigError
from router.gateway.config.engines import EngineSources

# Header-safe: visible ASCII, no spaces (a key is one token after "Bearer ").
_KEY_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F))


class EngineKeys:
    """``Authorization`` values by engine URL, read from the environment once."""

    __slots__ = ("_other", "_static")

    def __init__(self, sources: EngineSources, environ: Mapping[str, str]) -> None:
        default = sources.api_key_env
        self._static = {
            url: _bearer(sources.static_key_envs.get(url) or default, environ)
            for url in sources.static
        }
        # One variable for every DNS-found engine (the parser refuses names that differ).
        dns_env = sources.dns[0].api_key_env if sources.dns else ""
        self._other = _bearer(dns_env or default, environ)

    def __call__(self, engine: str) -> str | None:
        """The ``Authorization`` value for ``engine`` (a canonical engine URL), or None."""
        return self._static.get(engine, self._other)

    def __repr__(self) -> str:  # never the keys themselves
        with_key = sum(1 for v in self._static.values() if v)
        return f"EngineKeys(static_with_key={with_key}, others={'key' if self._other else 'none'})"


def _bearer(env: str, environ: Mapping[str, str]) -> str | None:
    if not env:
        return None
    key = environ.get(env, "").strip()
    if not key:
        raise ConfigError(f"engine API key: environment variable {env} is unset or empty")
    if not set(key) <= _KEY_CHARS:
        raise ConfigError(
            f"engine API key: environment variable {env} holds characters a header cannot carry"
        )
    return f"Bearer {key}"
