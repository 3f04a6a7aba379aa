"""A loopback HTTP CONNECT proxy that can cut, heal and reset the connections through it.

gRPC dials through the proxy named by the ``grpc_proxy`` variable (it sends ``CONNECT
HOST:PORT``, then speaks HTTP/2 through the tunnel), so giving each replica a proxy of its own
puts every gossip connection that replica opens through it, and only those. The proxy knows
whose it is and where each tunnel goes, so it can cut one replica off from some peers while
the others still talk: a cut replica's own proxy cuts every tunnel, and each peer's proxy
cuts the tunnels to it.

A cut drops traffic the way a broken network does: nothing is refused, bytes stop moving
(the senders' buffers fill and their calls time out), new tunnels are held before they
connect. On heal the held bytes move on, late, as TCP delivers them once a path is back. A
black hole is the same, except that the tunnels open at the cut never move another byte, as
when TCP's retransmission timer has backed off well past the heal: only new connections work
again. A reset instead closes the tunnels and refuses new ones (``503``) until healed.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

# What one read moves through a tunnel.
CHUNK = 64 * 1024
# The CONNECT request's head: gRPC's is well under a kilobyte.
MAX_HEAD = 8 * 1024


@dataclass
class _Tunnel:
    target: str
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    lost: bool = False


class ConnectProxy:
    """One replica's outgoing gossip connections, cut and healed per target address."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.tunnels_opened = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tunnels: list[_Tunnel] = []
        # Targets whose traffic is dropped ("*": every target), and those refused.
        self._cut: set[str] = set()
        self._refused: set[str] = set()
        self._healed = asyncio.Event()
        self._healed.set()

    @property
    def url(self) -> str:
        """The value of ``grpc_proxy`` for the replica this proxy carries."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and close every tunnel, held ones included."""
        self.heal()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self, *targets: str, black_hole: bool = False) -> None:
        """Drop traffic to ``targets`` (none given: to everyone) until ``heal``; with
        ``black_hole``, the tunnels open now to them stay silent even after it."""
        names = set(targets or ("*",))
        self._cut.update(names)
        self._healed.clear()
        if black_hole:
            for tunnel in self._tunnels:
                tunnel.lost = tunnel.lost or self._blocked(tunnel.target, names)

    def reset(self, *targets: str) -> None:
        """Close the tunnels to ``targets`` (none: every tunnel); refuse new ones until heal."""
        names = set(targets or ("*",))
        self._refused.update(names)
        for tunnel in self._tunnels:
            if "*" in names or tunnel.target in names:
                for w in tunnel.writers:
                    w.transport.abort()

    def heal(self) -> None:
        self._cut.clear()
        self._refused.clear()
        self._healed.set()

    def _blocked(self, target: str, within: set[str]) -> bool:
        return "*" in within or target in within

    async def _open(self, target: str) -> None:
        while self._blocked(target, self._cut):
            await self._healed.wait()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        tunnel: _Tunnel | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            parts = head[:MAX_HEAD].split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or parts[0] != b"CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                return
            target = parts[1].decode("ascii")
            await self._open(target)
            if self._blocked(target, self._refused):
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            up_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
            tunnel = _Tunnel(target, [writer, upstream])
            self._tunnels.append(tunnel)
            self.tunnels_opened += 1
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(
                self._pipe(tunnel, reader, upstream), self._pipe(tunnel, up_reader, writer)
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            if tunnel is not None:
                self._tunnels.remove(tunnel)
            for w in (writer, upstream):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError):
                        await w.wait_closed()

    async def _pipe(
        self, tunnel: _Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                # A cut holds what was read; it moves on at the heal, as TCP would resend it.
                await self._open(tunnel.target)
                if tunnel.lost:
                    await asyncio.Event().wait()  # until the proxy closes
                writer.write(data)
                await writer.drain()
        finally:
            if writer.can_write_eof():
                with contextlib.suppress(OSError):
                    writer.write_eof()
