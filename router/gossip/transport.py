"""The seam between the gossip node and the network: request bytes in, reply bytes out.

A node only ever makes one call: send an envelope to an address and wait (bounded) for the
reply envelope. It serves the same: a handler turns a request envelope into a reply envelope,
or raises ``Refused``. ``InMemoryNetwork`` connects many nodes inside one process with
injectable loss, duplication, latency and partitions, on the node's clock; ``grpc_transport``
does the same over gRPC.
"""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.gossip.clock import Clock

Handler = Callable[[bytes], Awaitable[bytes]]


class TransportError(Exception):
    """A call failed: unreachable, timed out, refused or too large. Nothing was merged."""


class PeerRefused(TransportError):
    """The peer answered, refusing the request (its reason in the message): wrong secret,
    a frame for another node, a clock beyond its replay window, or malformed."""


class Refused(Exception):
    """Raised by a handler to refuse a request (failed authentication, malformed, busy)."""


class Transport(ABC):
    """Moves envelopes; knows nothing of what is in them."""

    @abstractmethod
    async def start(self, handler: Handler) -> str:
        """Start serving ``handler``; return the HOST:PORT bound."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop serving and close every connection."""

    # The timeout is the transport's own, not asyncio.timeout: gRPC sends it to the peer as a
    # deadline, and the in-memory network runs it on the (possibly virtual) clock.
    @abstractmethod
    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        """Send ``payload`` to ``address``; the reply, or TransportError within ``timeout``."""


@dataclass(frozen=True, slots=True)
class Faults:
    """What the in-memory network does to traffic, drawn per message."""

    # Probability that a request, or its reply, is lost (the caller times out).
    loss: float = 0.0
    # Probability that a request is delivered a second time (the reply to it is discarded).
    duplicate: float = 0.0
    # One-way delay, uniform in [min, max] seconds: unequal delays reorder messages.
    latency: tuple[float, float] = (0.0, 0.0)


NO_FAULTS = Faults()


class InMemoryNetwork:
    """Addresses to handlers inside one process, with faults on the caller's clock."""

    def __init__(
        self,
        clock: Clock,
        faults: Faults = NO_FAULTS,
        seed: int = 0,
        max_message_bytes: int = 4 * 1024 * 1024,
        max_serving: int = 64,
    ) -> None:
        self.clock = clock
        self.faults = faults
        self.max_message_bytes = max_message_bytes
        self.max_serving = max_serving
        self._rng = random.Random(seed)
        self._handlers: dict[str, Handler] = {}
        self._serving: dict[str, int] = {}
        self._cut: set[frozenset[str]] = set()
        # Observers of every request delivered: (source, destination, payload).
        self.taps: list[Callable[[str, str, bytes], None]] = []

    def transport(self, address: str) -> InMemoryTransport:
        """A transport that will listen on ``address``."""
        return InMemoryTransport(self, address)

    def partition(self, a: str, b: str) -> None:
        """Drop all traffic between ``a`` and ``b`` (both ways) until ``heal``."""
        self._cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cut.clear()

    def _listen(self, address: str, handler: Handler) -> None:
        if address in self._handlers:
            raise TransportError(f"address in use: {address}")
        self._handlers[address] = handler

    def _close(self, address: str) -> None:
        self._handlers.pop(address, None)

    async def deliver(self, src: str, dst: str, payload: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        """Carry one request and its reply, applying the faults."""
        if len(payload) > self.max_message_bytes:
            raise TransportError(f"message of {len(payload)} bytes exceeds the limit")
        handler = self._handlers.get(dst)
        if handler is None:
            raise TransportError(f"connection refused: {dst}")
        rng, f = self._rng, self.faults
        if frozenset((src, dst)) in self._cut or rng.random() < f.loss:
            await self.clock.sleep(timeout)
            raise TransportError(f"timeout: {dst}")
        there, back = rng.uniform(*f.latency), rng.uniform(*f.latency)
        if there + back >= timeout:
            await self.clock.sleep(timeout)
            raise TransportError(f"timeout: {dst}")
        if there:
            await self.clock.sleep(there)
        reply = await self._serve(dst, handler, payload, src)
        if rng.random() < f.duplicate:
            with contextlib.suppress(TransportError):
                await self._serve(dst, handler, payload, src)
        if rng.random() < f.loss:
            await self.clock.sleep(timeout - there)
            raise TransportError(f"timeout: {dst}")
        if back:
            await self.clock.sleep(back)
        return reply

    async def _serve(self, dst: str, handler: Handler, payload: bytes, src: str) -> bytes:
        if self._handlers.get(dst) is not handler:
            raise TransportError(f"connection reset: {dst}")
        if self._serving.get(dst, 0) >= self.max_serving:
            raise TransportError(f"busy: {dst}")
        for tap in self.taps:
            tap(src, dst, payload)
        self._serving[dst] = self._serving.get(dst, 0) + 1
        try:
            reply = await handler(payload)
        except Refused as e:
            raise PeerRefused(f"refused by {dst}: {e}") from e
        finally:
            self._serving[dst] -= 1
        if len(reply) > self.max_message_bytes:
            raise TransportError(f"reply of {len(reply)} bytes exceeds the limit")
        return reply


class InMemoryTransport(Transport):
    """One node's endpoint on an ``InMemoryNetwork``."""

    def __init__(self, network: InMemoryNetwork, address: str) -> None:
        self.network = network
        self.address = address

    async def start(self, handler: Handler) -> str:
        self.network._listen(self.address, handler)
        return self.address

    async def stop(self) -> None:
        self.network._close(self.address)

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        return await self.network.deliver(self.address, address, payload, timeout)
