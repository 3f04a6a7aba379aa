"""Gossip over real grpc.aio servers on loopback: convergence, auth, TLS, failure detection.

Waits are bounded (``tests.support.eventually``) and nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest

from router.core.index import BlockIndex, IndexLimits
from router.core.load import Load, LoadBook
from router.gateway.replicas.delegate import IndexDelegate, run_origin
from router.gossip.auth import Sealer
from router.gossip.config import LOCAL, GossipConfig, TlsFiles
from router.gossip.grpc_transport import GrpcTransport, transport_for
from router.gossip.membership import State
from router.gossip.node import GossipNode
from router.gossip.transport import TransportError
from router.gossip.wire import PROTOCOL_VERSION, pb
from tests.support import LOOPBACK, eventually, free_port

SECRET = b"grpc-test-secret-0123456789"
LIMITS = IndexLimits(engine_capacity_blocks=4096)
# Seconds any wait may take: real gRPC servers on a machine busy with other tests.
WAIT = 15.0


@dataclass
class Peer:
    name: str
    port: int
    node: GossipNode
    index: BlockIndex
    loads: LoadBook
    bridge: IndexDelegate

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


class Nodes:
    """Starts gossip nodes on loopback and stops every one of them at the end."""

    def __init__(self) -> None:
        self.started: list[Peer] = []

    async def start(
        self,
        name: str,
        *,
        port: int | None = None,
        seeds: tuple[str, ...] = (),
        secret: bytes | None = SECRET,
        tls: TlsFiles | None = None,
    ) -> Peer:
        port = port or free_port()
        config = GossipConfig(
            node_id=name,
            bind=f"{LOOPBACK}:{port}",
            seeds=seeds,
            secret=secret,
            tls=tls,
            tuning=LOCAL,
        )
        index = BlockIndex(LIMITS, origin=run_origin(name))
        loads = LoadBook()
        bridge = IndexDelegate(index, loads)
        node = GossipNode(config, bridge, transport_for(config))
        await node.start()
        peer = Peer(name, port, node, index, loads, bridge)
        self.started.append(peer)
        return peer

    async def stop_all(self) -> None:
        for p in self.started:
            await p.node.stop(leave=False)


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    n = Nodes()
    try:
        yield n
    finally:
        await n.stop_all()


def alive_peers(p: Peer) -> int:
    return p.node.stats().peers["alive"]


def state_of(p: Peer, name: str) -> State | None:
    return next((m.state for m in p.node.members() if m.id == name), None)


async def test_grpc_three_nodes_share_deltas_and_load(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b", seeds=(a.address,))
    c = await nodes.start("c", seeds=(b.address,))
    peers = [a, b, c]
    await eventually(lambda: all(alive_peers(p) == 2 for p in peers), timeout=WAIT)
    b.bridge.queue(b.index.confirm("engine", [1, 2, 3], 0.0))
    c.loads.acquire("engine", 64)
    await eventually(
        lambda: all(set(p.index.export_keys("engine")) == {1, 2, 3} for p in peers), timeout=WAIT
    )
    await eventually(
        lambda: all(p.loads.total("engine") == Load(1, 64) for p in peers), timeout=WAIT
    )
    assert a.node.stats().counters.bytes_in > 0


async def test_grpc_wrong_secret_refused_counted_not_merged(nodes: Nodes) -> None:
    a = await nodes.start("a")
    rogue = await nodes.start("rogue", seeds=(a.address,), secret=b"some-other-secret-987654")
    rogue.bridge.queue(rogue.index.confirm("engine", [9], 0.0))
    await eventually(lambda: a.node.stats().counters.refused_mac >= 2, timeout=WAIT)
    assert [m.id for m in a.node.members()] == ["a"]
    assert a.index.export_keys("engine") == []
    assert rogue.node.stats().counters.call_failures >= 1


async def test_grpc_plain_client_speaks_the_protocol(nodes: Nodes) -> None:
    # A client that knows only the proto (package kvrouter.gossip.v1, service Gossip, unary
    # Exchange of Envelopes), as any gRPC stub generated from it would call.
    a = await nodes.start("a")
    sealer = Sealer(SECRET)
    frame = pb.Frame(
        version=PROTOCOL_VERSION,
        sender="stub-client",
        sent_unix_ms=int(time.time() * 1000),
        nonce=12345,
        recipient_id="a",
        ping=pb.Ping(target_id="a"),
    )
    data = frame.SerializeToString()
    async with grpc.aio.insecure_channel(a.address) as channel:
        exchange = channel.unary_unary(
            "/kvrouter.gossip.v1.Gossip/Exchange",
            request_serializer=pb.Envelope.SerializeToString,
            response_deserializer=pb.Envelope.FromString,
        )
        reply = await exchange(pb.Envelope(frame=data, mac=sealer.mac(data)), timeout=5)
        sealer.verify(reply.frame, reply.mac)
        answer = pb.Frame.FromString(reply.frame)
        assert answer.reply_to == 12345 and answer.WhichOneof("body") == "ack"
        assert answer.recipient_id == "stub-client"
        # The same envelope again is a replay.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await exchange(pb.Envelope(frame=data, mac=sealer.mac(data)), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert a.node.stats().counters.refused_replay == 1


def _sealed_ping(field: str, value: str) -> pb.Envelope:
    """A ping from a stub client, sealed with the fleet's secret, for ``field`` = ``value``."""
    frame = pb.Frame(
        version=PROTOCOL_VERSION,
        sender="stub-client",
        sent_unix_ms=int(time.time() * 1000),
        nonce=secrets.randbits(64) or 1,
        ping=pb.Ping(),
    )
    if field:
        setattr(frame, field, value)
    data = frame.SerializeToString()
    return pb.Envelope(frame=data, mac=Sealer(SECRET).mac(data))


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("recipient_id", "a", True),
        ("recipient_address", "{a}", True),
        ("recipient_id", "b", False),
        ("recipient_address", "127.0.0.1:1", False),
        ("", "", False),
    ],
    ids=["own_id", "own_address", "another_id", "another_address", "no_recipient"],
)
async def test_grpc_plain_client_frame_for_another_node_unauthenticated_and_counted(
    nodes: Nodes, field: str, value: str, accepted: bool
) -> None:
    a = await nodes.start("a")
    envelope = _sealed_ping(field, value.format(a=a.address))
    async with grpc.aio.insecure_channel(a.address) as channel:
        exchange = channel.unary_unary(
            "/kvrouter.gossip.v1.Gossip/Exchange",
            request_serializer=pb.Envelope.SerializeToString,
            response_deserializer=pb.Envelope.FromString,
        )
        if accepted:
            reply = pb.Frame.FromString((await exchange(envelope, timeout=5)).frame)
            assert reply.WhichOneof("body") == "ack"
        else:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await exchange(envelope, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "recipient" in (e.value.details() or "")
    assert a.node.stats().counters.refused_recipient == (0 if accepted else 1)


async def test_grpc_stopped_node_dead_restarted_node_alive(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b", seeds=(a.address,))
    c = await nodes.start("c", seeds=(a.address,))
    await eventually(lambda: all(alive_peers(p) == 2 for p in (a, b, c)), timeout=WAIT)
    c.loads.acquire("engine", 5)
    await eventually(lambda: a.loads.total("engine") == Load(1, 5), timeout=WAIT)
    await c.node.stop(leave=False)
    await eventually(
        lambda: state_of(a, "c") is State.DEAD and state_of(b, "c") is State.DEAD, timeout=WAIT
    )
    assert a.loads.total("engine") == Load(0, 0)
    back = await nodes.start("c", port=c.port, seeds=(a.address,))
    await eventually(lambda: all(state_of(p, "c") is State.ALIVE for p in (a, b)), timeout=WAIT)
    assert back.node.stats().incarnation >= 1


def _make_certs(root: Path) -> tuple[TlsFiles, TlsFiles]:
    """A CA with one node certificate, and a certificate from an unrelated CA."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)

    ext = root / "ext.cnf"
    ext.write_text("subjectAltName=DNS:kvrouter-gossip\nextendedKeyUsage=serverAuth,clientAuth\n")
    files = []
    for ca in ("ca", "other-ca"):
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run(
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "1",
            "-subj",
            f"/CN={ca}",
        )
        run(
            "req",
            *ec,
            "-keyout",
            f"{ca}-node.key",
            "-out",
            f"{ca}-node.csr",
            "-subj",
            "/CN=kvrouter-gossip",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{ca}-node.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{ca}-node.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        )
        files.append(TlsFiles(root / f"{ca}-node.pem", root / f"{ca}-node.key", root / f"{ca}.pem"))
    return files[0], files[1]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_grpc_mutual_tls_peers_converge_outsider_refused(
    nodes: Nodes, tmp_path: Path
) -> None:
    tls, outsider_tls = _make_certs(tmp_path)
    a = await nodes.start("a", secret=None, tls=tls)
    b = await nodes.start("b", seeds=(a.address,), secret=None, tls=tls)
    await eventually(lambda: alive_peers(a) == 1 and alive_peers(b) == 1, timeout=WAIT)
    a.bridge.queue(a.index.confirm("engine", [4, 5], 0.0))
    await eventually(lambda: set(b.index.export_keys("engine")) == {4, 5}, timeout=WAIT)
    outsider = await nodes.start("outsider", seeds=(a.address,), secret=None, tls=outsider_tls)
    await eventually(lambda: outsider.node.stats().counters.call_failures >= 3, timeout=WAIT)
    assert {m.id for m in a.node.members()} == {"a", "b"}


@pytest.mark.parametrize("late", [True, False], ids=["timed-out", "answered"])
async def test_grpc_transport_call_timed_out_next_call_on_a_new_connection(late: bool) -> None:
    # A connection whose packets are lost looks the same as a slow peer: the call times out.
    # Only a new connection escapes a dead one, so a timeout gives the next call a fresh one.
    release = asyncio.Event()

    async def handler(payload: bytes) -> bytes:
        if payload == b"slow":
            await release.wait()
        return payload

    server, client = GrpcTransport(f"{LOOPBACK}:0"), GrpcTransport(f"{LOOPBACK}:0")
    address = await server.start(handler)
    try:
        assert await client.call(address, b"fast", WAIT) == b"fast"
        first = client._channels[address]
        # A long call on the first connection, such as a snapshot's chunk, is left to finish.
        running = asyncio.create_task(client.call(address, b"slow", WAIT))
        await eventually(lambda: client._calls.get(first) == 1, timeout=WAIT)
        if late:
            with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
                await client.call(address, b"slow", 0.05)
        assert await client.call(address, b"fast", WAIT) == b"fast"
        assert (client._channels[address] is not first) is late
        release.set()
        assert await running == b"slow"
        await eventually(lambda: not client._closing, timeout=WAIT)
    finally:
        release.set()
        await client.stop()
        await server.stop()
