"""Engines as Envoy names them: ``ip:port`` for each engine URL, and back.

Envoy sends a request to the pick as an original destination: the address must be an IP
literal, never a name. Engines given by IP (every one found by DNS discovery or from the
Kubernetes API is) map at once; one given by a host name is resolved in the background
(``run``), and is no endpoint until its name has resolved. Only the pool's current engines
are kept.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping

from yarl import URL

from router import hostport

log = logging.getLogger(__name__)

RESOLVE_SECONDS = 10.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_port(url: str) -> tuple[str, int] | None:
    u = URL(url)
    port = u.explicit_port or _DEFAULT_PORTS.get(u.scheme)
    if not u.host or port is None:
        return None
    return u.host, port


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve_address(host: str, port: int) -> str:
    """The first address ``host`` resolves to (IPv4 before IPv6); raises ``OSError``."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = sorted({str(i[4][0]) for i in infos}, key=lambda a: (":" in a, a))
    if not addresses:
        raise OSError(f"{host} resolved to no address")
    return addresses[0]


class Endpoints:
    """``ip:port`` <-> engine URL for the pool's engines."""

    def __init__(
        self,
        engines: Callable[[], Iterable[str]],
        resolve: Callable[[str, int], Awaitable[str]] = resolve_address,
    ) -> None:
        self._engines = engines
        self._resolve = resolve
        self._by_engine: dict[str, str] = {}
        self._by_endpoint: dict[str, str] = {}

    def endpoint_of(self, engine: str) -> str | None:
        """``engine``'s ``ip:port``; None while its name has not resolved."""
        found = self._by_engine.get(engine)
        if found is not None:
            return found
        hp = _host_port(engine)
        if hp is None or not _literal(hp[0]):
            return None
        self._set(engine, hostport.join(*hp))
        return self._by_engine[engine]

    def engine_of(self, endpoint: str) -> str | None:
        """The engine at ``endpoint`` (``ip:port``), among those mapped so far."""
        engine = self._by_endpoint.get(endpoint)
        if engine is None:
            for e in self._engines():
                self.endpoint_of(e)
            engine = self._by_endpoint.get(endpoint)
        return engine

    def engines_at(self, endpoints: Iterable[str]) -> frozenset[str]:
        """The engines at any of ``endpoints``."""
        found = (self.engine_of(self._normal(e)) for e in endpoints)
        return frozenset(e for e in found if e is not None)

    @staticmethod
    def _normal(endpoint: str) -> str:
        try:
            return hostport.join(*hostport.split(endpoint))
        except ValueError:
            return endpoint

    def _set(self, engine: str, endpoint: str) -> None:
        old = self._by_engine.get(engine)
        if old is not None and self._by_endpoint.get(old) == engine:
            del self._by_endpoint[old]
        self._by_engine[engine] = endpoint
        self._by_endpoint[endpoint] = engine

    def mapping(self) -> Mapping[str, str]:
        return dict(self._by_engine)

    async def refresh(self) -> None:
        """Forget engines the pool dropped; resolve the names of the others."""
        current = set(self._engines())
        for gone in set(self._by_engine) - current:
            endpoint = self._by_engine.pop(gone)
            if self._by_endpoint.get(endpoint) == gone:
                del self._by_endpoint[endpoint]
        for engine in current:
            hp = _host_port(engine)
            if hp is None or _literal(hp[0]):
                self.endpoint_of(engine)
                continue
            try:
                address = await self._resolve(*hp)
            except OSError as e:
                log.warning("cannot resolve engine %s: %s; keeping its last address", engine, e)
                continue
            self._set(engine, hostport.join(address, hp[1]))

    async def run(self, interval: float = RESOLVE_SECONDS) -> None:
        """``refresh`` every ``interval`` seconds, forever."""
        while True:
            await self.refresh()
            await asyncio.sleep(interval)
