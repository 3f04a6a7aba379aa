"""Where peers might be: seed addresses and a DNS name, resolved again on every call.

A Kubernetes headless Service resolves to the address of every ready replica, so
re-resolving it periodically finds replicas that started after this one. The resolver is
injectable; the default asks the event loop (``getaddrinfo``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence

from router import hostport
from router.gossip.config import split_hostport

# (host, port) -> the HOST:PORT addresses it resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with the event loop's getaddrinfo; every address once, sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({hostport.join(str(info[4][0]), port) for info in infos})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Discovery:
    """Seeds (HOST:PORT) and an optional DNS name, turned into candidate peer addresses."""

    def __init__(
        self, seeds: Sequence[str], dns_target: tuple[str, int] | None, resolver: Resolver
    ) -> None:
        self.seeds = tuple(seeds)
        self.dns_target = dns_target
        self.resolver = resolver
        self.failures = 0

    async def addresses(self) -> list[str]:
        """Every address the seeds and the DNS name give now (failed lookups are skipped)."""
        targets = [split_hostport(s, "seed") for s in self.seeds]
        if self.dns_target is not None:
            targets.append(self.dns_target)
        found: dict[str, None] = {}
        for host, port in targets:
            if _is_ip(host):
                found[hostport.join(host, port)] = None
                continue
            try:
                for address in await self.resolver(host, port):
                    found[address] = None
            except OSError:
                # DNS is down or the name has no ready replicas yet: try again next time.
                self.failures += 1
        return list(found)
