"""The gossip transport over gRPC (grpc.aio): one unary method carrying envelope bytes.

The method is ``kvrouter.gossip.v1.Gossip/Exchange`` from proto/gossip.proto. It is served and
called without (de)serialisers, so the node's bytes are exactly what crosses the wire and the
node can check the MAC before anything parses the frame; a client built from the generated
stub speaks the same protocol. With ``TlsFiles`` the listener and every channel use mutual TLS.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import grpc
import grpc.aio

from router.gossip.config import GossipConfig, TlsFiles
from router.gossip.transport import Handler, PeerRefused, Refused, Transport, TransportError
from router.gossip.wire import EXCHANGE_PATH, SERVICE

# Redial a restarted peer quickly: gRPC's default reconnect backoff grows to two minutes,
# longer than a suspicion lasts, so a peer back in seconds would be declared dead anyway.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# A fresh channel (a new connection) after these. UNAVAILABLE: the peer may have restarted
# elsewhere. DEADLINE_EXCEEDED: the connection may be dead without either end knowing, as
# after a partition that dropped packets: gRPC keeps it and TCP retransmits on it, backing
# off for minutes, so a healed fleet would stay apart that long.
_REDIAL_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class GrpcTransport(Transport):
    """Serves the gossip handler on ``bind`` and calls peers over pooled channels."""

    def __init__(
        self,
        bind: str,
        *,
        tls: TlsFiles | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        max_serving: int = 64,
        max_channels: int = 256,
    ) -> None:
        self.bind = bind
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self.max_serving = max_serving
        self.max_channels = max_channels
        self._server: grpc.aio.Server | None = None
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        # Calls in flight per channel, so that a channel replaced is closed once they end.
        self._calls: dict[grpc.aio.Channel, int] = {}
        self._retired: dict[grpc.aio.Channel, asyncio.Event] = {}
        self._size_options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]

    async def start(self, handler: Handler) -> str:
        async def exchange(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                return await handler(request)
            except Refused as e:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
                raise  # not reached: abort raises

        method = grpc.unary_unary_rpc_method_handler(exchange)
        # gRPC sets SO_REUSEPORT by default: a second replica started on a port already in
        # use would silently share it (the kernel splitting peers between the two) instead of
        # failing to start.
        options = [*self._size_options, ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=options, maximum_concurrent_rpcs=self.max_serving)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Exchange": method}),)
        )
        try:
            if self.tls is not None:
                port = server.add_secure_port(self.bind, server_credentials(self.tls))
            else:
                port = server.add_insecure_port(self.bind)
        except RuntimeError as e:  # newer grpcio raise instead of returning port 0
            raise TransportError(f"cannot listen on {self.bind}: {e}") from None
        if port == 0:
            raise TransportError(f"cannot listen on {self.bind}")
        await server.start()
        self._server = server
        host = self.bind.rpartition(":")[0]
        return f"{host}:{port}"

    async def stop(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        await asyncio.gather(*(ch.close() for ch in channels), *self._closing)
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        if len(payload) > self.max_message_bytes:
            raise TransportError(f"message of {len(payload)} bytes exceeds the limit")
        channel = self._channel(address)
        method = channel.unary_unary(EXCHANGE_PATH)
        self._calls[channel] = self._calls.get(channel, 0) + 1
        try:
            reply: bytes = await method(payload, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() in _REDIAL_CODES:
                self._drop(address)
            failed = PeerRefused if e.code() == grpc.StatusCode.UNAUTHENTICATED else TransportError
            raise failed(f"{address}: {e.code().name}: {e.details()}") from e
        finally:
            left = self._calls.pop(channel) - 1
            if left:
                self._calls[channel] = left
            elif channel in self._retired:
                self._retired.pop(channel).set()
        return reply

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is not None:
            self._channels.move_to_end(address)
            return channel
        options: list[tuple[str, Any]] = [*self._size_options, *_RECONNECT_OPTIONS]
        if self.tls is not None:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
            channel = grpc.aio.secure_channel(address, channel_credentials(self.tls), options)
        else:
            channel = grpc.aio.insecure_channel(address, options)
        self._channels[address] = channel
        if len(self._channels) > self.max_channels:
            self._drop(next(iter(self._channels)))
        return channel

    def _drop(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            task = asyncio.create_task(self._close_when_idle(channel))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_when_idle(self, channel: grpc.aio.Channel) -> None:
        # Calls still running on it (a snapshot's chunks beside a ping that timed out) end
        # first, each by its own deadline.
        if self._calls.get(channel):
            idle = self._retired[channel] = asyncio.Event()
            await idle.wait()
        await channel.close()


def transport_for(config: GossipConfig) -> GrpcTransport:
    """The gRPC transport a node with ``config`` listens and dials with."""
    t = config.tuning
    return GrpcTransport(
        config.bind,
        tls=config.tls,
        max_message_bytes=t.max_message_bytes,
        max_serving=t.max_serving,
        max_channels=t.max_members,
    )


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: present our certificate, require a client certificate."""
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Client side of mutual TLS: verify the peer against the CA, present our certificate."""
    cert, key, ca = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
