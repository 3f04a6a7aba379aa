"""Client API keys: who may use the gateway's OpenAI routes, and under which name.

Off unless keys are configured. Keys come from a file (``auth.api_keys_file``, e.g. mounted
from a Kubernetes Secret) and from an environment variable (``auth.api_keys_env``, default
KVROUTER_API_KEYS), one ``NAME=KEY`` or ``NAME=sha256:HEX`` per line (or comma-separated in the
variable). Only digests are kept in memory; a request's ``Authorization: Bearer KEY`` is
digested and compared in constant time against every known digest (Anthropic's clients send the
key as ``x-api-key: KEY`` instead, taken the same way). The matching key's name is
the request's tenant for flow control. Anything else on ``/v1/`` is a 401 in the OpenAI shape;
the probes and ``/metrics`` stay open (the admin routes have their own token).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from router.core.fields import ConfigError
from router.gateway.openai.errors import GatewayError, api_of, error_response

# The key's name, for the rest of the request's life (flow control's tenant).
KEY_NAME = web.RequestKey("kvrouter.key_name", str)
GUARDED_PREFIX = "/v1/"
MAX_KEYS = 100_000


class InvalidApiKey(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """Key digests by name; empty: authentication is off."""

    digests: Mapping[bytes, str]

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def name_of(self, presented: str) -> str | None:
        """The name of the key ``presented``, or None; constant time in the key's content."""
        d = _digest(presented)
        found = None
        for known, name in self.digests.items():
            if hmac.compare_digest(d, known):
                found = name
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def parse_keys(text: str, where: str) -> dict[bytes, str]:
    """``NAME=KEY`` / ``NAME=sha256:HEX`` entries, one per line or comma; ConfigError on junk."""
    out: dict[bytes, str] = {}
    entries = [e.strip() for line in text.splitlines() for e in line.split(",")]
    for n, entry in enumerate(e for e in entries if e and not e.startswith("#")):
        name, sep, key = entry.partition("=")
        name, key = name.strip(), key.strip()
        if not sep or not name or not key:
            raise ConfigError(f"{where}: entry {n + 1}: expected NAME=KEY or NAME=sha256:HEX")
        if key.startswith("sha256:"):
            try:
                digest = bytes.fromhex(key.removeprefix("sha256:"))
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ConfigError(f"{where}: key {name!r}: sha256: needs 64 hex digits")
        else:
            digest = _digest(key)
        out[digest] = name
        if len(out) > MAX_KEYS:
            raise ConfigError(f"{where}: more than {MAX_KEYS} keys")
    return out


def load_keys(file: str, env_name: str, environ: Mapping[str, str] = os.environ) -> ApiKeys:
    """The configured keys (file, then environment); raises ``ConfigError``."""
    digests: dict[bytes, str] = {}
    if file:
        try:
            text = Path(file).read_text()
        except OSError as e:
            raise ConfigError(
                f"auth.api_keys_file: cannot read {file}: {e.strerror or e}"
            ) from None
        digests.update(parse_keys(text, file))
    if env_name and environ.get(env_name):
        digests.update(parse_keys(environ[env_name], f"${env_name}"))
    return ApiKeys(digests)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(keys: ApiKeys) -> Middleware:
    """Require a known key on ``/v1/`` routes when keys are configured."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not keys.enabled or not request.path.startswith(GUARDED_PREFIX):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("x-api-key", "")
        name = keys.name_of(given.strip()) if given else None
        if name is None:
            err = InvalidApiKey(
                "a valid API key is required: 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            )
            return error_response(err, api=api_of(request.path))
        request[KEY_NAME] = name
        return await handler(request)

    return middleware
