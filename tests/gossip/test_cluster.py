"""Many replicas in one process over the in-memory network, on a virtual clock.

Every wait is bounded in virtual seconds (``Fleet.settle``); nothing here depends on how fast
the machine is.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from router.core.load import Load
from router.gateway.replicas.in_process import Fleet, Replica
from router.gossip.clock import ManualClock
from router.gossip.config import LOCAL
from router.gossip.membership import State
from router.gossip.node import GossipNode
from router.gossip.stats import samples
from router.gossip.transport import (
    Faults,
    Handler,
    InMemoryNetwork,
    InMemoryTransport,
    Transport,
    TransportError,
)
from router.gossip.wire import PROTOCOL_VERSION, pb


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet()
    try:
        yield f
    finally:
        await f.close()


def states_of(replicas: list[Replica], name: str) -> set[State]:
    out = set()
    for r in replicas:
        for m in r.node.members():
            if m.id == name:
                out.add(m.state)
    return out


def all_see(replicas: list[Replica], alive: int) -> bool:
    return all(r.node.stats().peers["alive"] == alive for r in replicas)


def same_contents(replicas: list[Replica]) -> bool:
    first = replicas[0].contents()
    return all(r.contents() == first for r in replicas[1:])


async def test_fleet_replicas_join_via_dns_all_alive(fleet: Fleet) -> None:
    rs = await fleet.start(6)
    assert await fleet.settle(lambda: all_see(rs, 5), limit=2.0)


async def test_fleet_delta_reaches_every_replica(fleet: Fleet) -> None:
    rs = await fleet.start(8)
    assert await fleet.settle(lambda: all_see(rs, 7), limit=2.0)
    rs[3].record("engine-a", [11, 12, 13])
    rs[5].record("engine-b", [21, 22])
    want = {"engine-a": frozenset({11, 12, 13}), "engine-b": frozenset({21, 22})}
    assert await fleet.settle(lambda: all(r.contents() == want for r in rs), limit=2.0)
    applied = sum(r.node.stats().counters.deltas_applied for r in rs)
    assert applied == 2 * 7
    assert set(rs[0].node.stats().convergence_lag) == {rs[3].index.origin, rs[5].index.origin}


async def test_fleet_load_summed_across_replicas(fleet: Fleet) -> None:
    rs = await fleet.start(4)
    rs[1].loads.acquire("e", 100)
    rs[2].loads.acquire("e", 50)
    rs[2].loads.acquire("e", 10)
    assert await fleet.settle(lambda: all(r.loads.total("e") == Load(3, 160) for r in rs), 2.0)
    rs[2].loads.release("e", 10)
    assert await fleet.settle(lambda: all(r.loads.total("e") == Load(2, 150) for r in rs), 2.0)


async def test_fleet_crashed_replica_dead_load_dropped_blocks_kept(fleet: Fleet) -> None:
    rs = await fleet.start(5)
    rs[1].record("e", [1, 2, 3])
    rs[1].loads.acquire("e", 40)
    assert await fleet.settle(lambda: all(r.loads.total("e").requests == 1 for r in rs), 2.0)
    await fleet.stop("r1")
    others = [r for r in rs if r.name != "r1"]
    assert await fleet.settle(lambda: states_of(others, "r1") == {State.DEAD}, limit=5.0)
    assert all(r.loads.total("e") == Load(0, 0) for r in others)
    assert all(r.contents() == {"e": frozenset({1, 2, 3})} for r in others)


async def test_fleet_restarted_replica_refutes_death_alive_again(fleet: Fleet) -> None:
    rs = await fleet.start(4)
    await fleet.stop("r2")
    others = [r for r in rs if r.name != "r2"]
    assert await fleet.settle(lambda: states_of(others, "r2") == {State.DEAD}, limit=5.0)
    back = await fleet.add("r2")
    everyone = [*others, back]
    assert await fleet.settle(lambda: all_see(everyone, 3), limit=5.0)
    assert back.node.stats().incarnation >= 1
    back.loads.acquire("e", 7)
    assert await fleet.settle(lambda: all(r.loads.total("e") == Load(1, 7) for r in others), 2.0)


async def test_fleet_graceful_leave_dead_without_probing(fleet: Fleet) -> None:
    rs = await fleet.start(5)
    rs[4].loads.acquire("e", 1)
    assert await fleet.settle(lambda: all(r.loads.total("e").requests == 1 for r in rs), 2.0)
    await fleet.stop("r4", leave=True)
    others = rs[:4]
    # Well under one suspicion timeout: the announcement, not failure detection, did it.
    assert await fleet.settle(lambda: states_of(others, "r4") == {State.DEAD}, limit=0.2)
    assert all(r.loads.total("e").requests == 0 for r in others)


async def test_fleet_short_partition_suspect_refuted_stays_alive() -> None:
    f = Fleet(tuning=dataclasses.replace(LOCAL, suspicion_mult=20.0))
    try:
        rs = await f.start(4)
        assert await f.settle(lambda: all_see(rs, 3), limit=2.0)
        for r in rs[1:]:
            f.network.partition("10.0.0.1:7946", r.address)
        assert await f.settle(lambda: State.SUSPECT in states_of(rs[1:], "r0"), limit=3.0)
        f.network.heal()
        assert await f.settle(lambda: states_of(rs, "r0") == {State.ALIVE}, limit=3.0)
        assert rs[0].node.stats().incarnation >= 1
    finally:
        await f.close()


async def test_fleet_partition_healed_before_rejoin_dead_replica_alive_load_counted_once() -> None:
    # No rejoin after the first: only the exchanges with members declared dead can bring the
    # cut-off replica back before it is forgotten.
    f = Fleet(tuning=dataclasses.replace(LOCAL, rejoin_interval=1000.0, dead_reclaim=60.0))
    try:
        rs = await f.start(3)
        assert await f.settle(lambda: all_see(rs, 2), limit=2.0)
        rs[0].loads.acquire("e", 10)
        rs[1].loads.acquire("e", 20)
        assert await f.settle(lambda: all(r.loads.total("e") == Load(2, 30) for r in rs), 2.0)
        for r in rs[1:]:
            f.network.partition(rs[0].address, r.address)
        assert await f.settle(lambda: states_of(rs[1:], "r0") == {State.DEAD}, limit=5.0)
        assert await f.settle(
            lambda: states_of(rs[:1], "r1") == states_of(rs[:1], "r2") == {State.DEAD}, 5.0
        )
        # Each side counts only what it still hears of: the other side's report is gone.
        assert rs[0].loads.total("e") == Load(1, 10)
        assert all(r.loads.total("e") == Load(1, 20) for r in rs[1:])
        rs[0].record("e", [1, 2])
        rs[2].record("e", [3])
        await f.clock.advance(10.0)  # type: ignore[attr-defined]
        f.network.heal()
        assert await f.settle(lambda: all_see(rs, 2), limit=5.0)
        assert await f.settle(lambda: all(r.loads.total("e") == Load(2, 30) for r in rs), 2.0)
        assert await f.settle(lambda: same_contents(rs), limit=5.0)
        assert rs[0].contents() == {"e": frozenset({1, 2, 3})}
    finally:
        await f.close()


async def test_fleet_partition_more_deltas_than_a_window_waits_for_repaired_by_snapshot() -> None:
    # r0 keeps the bodies of its newest 5000 deltas: after the heal its peers get those, more
    # than a window holds above the gap of the first 1000, which they never will get as deltas.
    f = Fleet(tuning=dataclasses.replace(LOCAL, retained_per_origin=5000, local_queue=8192))
    try:
        rs = await f.start(3)
        assert await f.settle(lambda: all_see(rs, 2), limit=2.0)
        for r in rs[1:]:
            f.network.partition(rs[0].address, r.address)
        for i in range(6000):
            rs[0].record(f"e{i % 3}", [i])
            if i % 500 == 0:
                await f.clock.advance(0.05)  # type: ignore[attr-defined]
        f.network.heal()
        assert await f.settle(lambda: same_contents(rs), limit=10.0)
        assert sum(len(r.index) for r in rs) == 3 * 6000
        assert all(r.node.stats().counters.snapshots_received >= 1 for r in rs[1:])
    finally:
        await f.close()


async def test_fleet_late_joiner_past_retention_catches_up_by_snapshot() -> None:
    f = Fleet(tuning=dataclasses.replace(LOCAL, retained_per_origin=4))
    try:
        rs = await f.start(3)
        for i in range(30):
            rs[i % 3].record(f"e{i % 4}", [i, i + 1000])
        assert await f.settle(lambda: same_contents(rs), limit=2.0)
        late = await f.add("late")
        assert await f.settle(lambda: same_contents([*rs, late]), limit=3.0)
        assert late.node.stats().counters.snapshots_received >= 1
        assert sum(r.node.stats().counters.snapshots_sent for r in rs) >= 1
        # Deltas after the snapshot still flow to the late joiner.
        rs[0].record("e9", [5])
        assert await f.settle(lambda: "e9" in late.contents(), limit=2.0)
    finally:
        await f.close()


async def test_fleet_late_joiner_within_retention_repaired_by_deltas(fleet: Fleet) -> None:
    rs = await fleet.start(3)
    for i in range(10):
        rs[0].record("e", [i])
    assert await fleet.settle(lambda: same_contents(rs), limit=2.0)
    late = await fleet.add("late")
    assert await fleet.settle(lambda: same_contents([*rs, late]), limit=2.0)
    assert late.node.stats().counters.snapshots_received == 0


async def test_fleet_wrong_secret_refused_counted_never_merged(fleet: Fleet) -> None:
    rs = await fleet.start(3)
    intruder = await fleet.add("intruder", secret=b"not-the-fleet-secret-at-all")
    intruder.record("e", [666])
    intruder.loads.acquire("e", 1)
    await fleet.clock.advance(1.0)  # type: ignore[attr-defined]
    refused = sum(r.node.stats().counters.refused_mac for r in rs)
    assert refused > 0
    for r in rs:
        assert "intruder" not in {m.id for m in r.node.members()}
        assert r.contents() == {}
        assert r.loads.total("e") == Load(0, 0)


async def test_fleet_replayed_envelope_refused_and_counted(fleet: Fleet) -> None:
    rs = await fleet.start(3)
    captured: list[tuple[str, str, bytes]] = []
    fleet.network.taps.append(lambda src, dst, data: captured.append((src, dst, data)))
    rs[0].record("e", [1])
    assert await fleet.settle(lambda: same_contents(rs) and bool(captured), limit=2.0)
    src, dst, data = captured[0]
    target = next(r for r in rs if r.address == dst)
    before = target.node.stats().counters.refused_replay
    with pytest.raises(TransportError, match="refused"):
        await fleet.network.deliver(src, dst, data, timeout=1.0)
    assert target.node.stats().counters.refused_replay == before + 1


def frame_of(payload: bytes) -> pb.Frame:
    frame: pb.Frame = pb.Frame.FromString(pb.Envelope.FromString(payload).frame)
    return frame


def recipient_of(frame: pb.Frame) -> tuple[str, str]:
    """("id", node id) or ("address", HOST:PORT): whom ``frame`` is for."""
    kind = frame.WhichOneof("recipient") or ""
    return kind.removeprefix("recipient_"), getattr(frame, kind) if kind else ""


def refused(replica: Replica, reason: str) -> float:
    """``replica``'s kvrouter_gossip_refused_total{reason}."""
    return sum(
        s.value
        for s in samples(replica.node.stats())
        if s.name == "kvrouter_gossip_refused_total" and s.labels["reason"] == reason
    )


async def test_fleet_frame_for_one_replica_replayed_to_another_refused_as_recipient(
    fleet: Fleet,
) -> None:
    rs = await fleet.start(3)
    assert await fleet.settle(lambda: all_see(rs, 2), limit=2.0)
    # r2 hears nothing from r0 or r1: anything it learns would come from the replayed frame.
    for r in rs[:2]:
        fleet.network.partition(r.address, rs[2].address)
    captured: list[bytes] = []

    def capture(src: str, dst: str, data: bytes) -> None:
        frame = frame_of(data)
        if dst == rs[1].address and frame.WhichOneof("body") == "updates" and frame.updates.deltas:
            captured.append(data)

    fleet.network.taps.append(capture)
    rs[0].record("e", [1, 2])
    assert await fleet.settle(lambda: bool(captured) and rs[1].contents() != {}, limit=2.0)
    assert recipient_of(frame_of(captured[0])) == ("id", "r1")
    with pytest.raises(TransportError, match="recipient"):
        await fleet.network.deliver("10.9.9.9:1", rs[2].address, captured[0], timeout=1.0)
    assert refused(rs[2], "recipient") == 1
    assert rs[2].contents() == {}
    # Its recipient had accepted it.
    assert rs[1].contents() == {"e": frozenset({1, 2})}
    assert refused(rs[1], "recipient") == 0


def _replica(fleet: Fleet, name: str, transport: Transport, **config: object) -> Replica:
    """A replica on ``fleet``'s network and clock, but with its own transport and settings."""
    base = fleet.build(name)
    cfg = dataclasses.replace(base.node.config, dns_name=None, **config)  # type: ignore[arg-type]
    node = GossipNode(cfg, base.bridge, transport, clock=fleet.clock, seed=fleet.seed)
    return dataclasses.replace(base, node=node, address=cfg.advertise or cfg.bind)


async def test_fleet_seed_dialled_by_address_joins_then_named_by_id(fleet: Fleet) -> None:
    rs = await fleet.start(2)
    address = "10.0.9.1:7946"
    sent: list[tuple[str, tuple[str, str]]] = []

    def record_joiners(src: str, dst: str, data: bytes) -> None:
        if src == address:
            sent.append((dst, recipient_of(frame_of(data))))

    fleet.network.taps.append(record_joiners)
    joiner = _replica(fleet, "joiner", fleet.network.transport(address), seeds=(rs[0].address,))
    await joiner.node.start()
    try:
        everyone = [*rs, joiner]
        assert await fleet.settle(lambda: all_see(everyone, 2), limit=2.0)
        await fleet.clock.advance(0.5)  # type: ignore[attr-defined]
        # A first contact names the address dialled; once r0 has answered, its id.
        assert sent[0] == (rs[0].address, ("address", rs[0].address))
        assert {recipient for _, recipient in sent[1:]} <= {("id", "r0"), ("id", "r1")}
        assert ("id", "r0") in {recipient for _, recipient in sent[1:]}
        assert sum(refused(r, "recipient") for r in everyone) == 0
    finally:
        await joiner.node.stop(leave=False)


class WildcardListener(InMemoryTransport):
    """A listener bound on every interface: reached at each of ``addresses``."""

    def __init__(self, network: InMemoryNetwork, port: int, addresses: list[str]) -> None:
        super().__init__(network, addresses[0])
        self.port = port
        self.addresses = addresses

    async def start(self, handler: Handler) -> str:
        for address in self.addresses:
            self.network._listen(address, handler)
        return f"0.0.0.0:{self.port}"

    async def stop(self) -> None:
        for address in self.addresses:
            self.network._close(address)


async def test_fleet_wildcard_listeners_dialled_on_loopback_by_a_sibling_join(
    fleet: Fleet,
) -> None:
    # Two workers of one pod: bound on every interface, advertising the pod's IP, and seeded
    # with each other on loopback.
    pod_ip = "10.0.7.7"
    workers = []
    for i, port in enumerate((7946, 7947)):
        listener = WildcardListener(fleet.network, port, [f"{pod_ip}:{port}", f"127.0.0.1:{port}"])
        sibling = f"127.0.0.1:{7947 - i}"
        workers.append(
            _replica(
                fleet,
                f"pod-w{i}",
                listener,
                bind=f"0.0.0.0:{port}",
                advertise=f"{pod_ip}:{port}",
                seeds=(sibling,),
            )
        )
    named: list[tuple[str, str]] = []
    fleet.network.taps.append(lambda src, dst, data: named.append(recipient_of(frame_of(data))))
    for w in workers:
        await w.node.start()
    try:
        assert await fleet.settle(lambda: all_see(workers, 1), limit=2.0)
        assert ("address", "127.0.0.1:7946") in named and ("address", "127.0.0.1:7947") in named
        assert sum(refused(w, "recipient") for w in workers) == 0
    finally:
        for w in workers:
            await w.node.stop(leave=False)


async def test_fleet_stale_frame_refused_as_stale(fleet: Fleet) -> None:
    rs = await fleet.start(2)
    sender = rs[0].node
    frame = pb.Frame(
        version=PROTOCOL_VERSION, sender="r0", nonce=7, recipient_id="r1", ping=pb.Ping()
    )
    frame.sent_unix_ms = int((fleet.clock.wall() - 3600) * 1000)
    payload = sender._envelopes.seal(frame)
    with pytest.raises(TransportError, match="stale"):
        await fleet.network.deliver(rs[0].address, rs[1].address, payload, timeout=1.0)
    assert rs[1].node.stats().counters.refused_stale == 1


async def test_fleet_garbage_bytes_refused_as_malformed(fleet: Fleet) -> None:
    rs = await fleet.start(2)
    with pytest.raises(TransportError):
        await fleet.network.deliver("x", rs[1].address, b"\xff\x00garbage", timeout=1.0)
    c = rs[1].node.stats().counters
    assert c.refused_malformed + c.refused_mac == 1


async def test_fleet_lossy_reordering_network_converges() -> None:
    faults = Faults(loss=0.2, duplicate=0.1, latency=(0.0, 0.01))
    f = Fleet(faults=faults, seed=3)
    try:
        rs = await f.start(6)
        for i in range(40):
            rs[i % 6].record(f"e{i % 3}", [i, i + 100, i + 200])
        want = {
            f"e{j}": frozenset(k for i in range(40) if i % 3 == j for k in (i, i + 100, i + 200))
            for j in range(3)
        }
        assert await f.settle(lambda: all(r.contents() == want for r in rs), limit=10.0)
    finally:
        await f.close()


async def test_fleet_partitioned_peer_memory_stays_bounded() -> None:
    tuning = dataclasses.replace(LOCAL, queue_items=64, retained_bytes=16_384, local_queue=32)
    f = Fleet(tuning=tuning)
    try:
        rs = await f.start(3)
        assert await f.settle(lambda: all_see(rs, 2), limit=2.0)
        for r in rs[1:]:
            f.network.partition(rs[0].address, r.address)
        for i in range(2000):
            rs[0].record("e", [i, i + 1, i + 2])
            if i % 50 == 0:
                await f.clock.advance(0.02)  # type: ignore[attr-defined]
        st = rs[0].node.stats()
        assert st.retained_bytes <= 16_384
        assert st.queued_rumours <= 3 * 64
        assert st.counters.queue_dropped > 0  # the bounds were reached, not just respected
        f.network.heal()
        assert await f.settle(lambda: same_contents(rs), limit=5.0)
        assert all(r.node.stats().counters.snapshots_received >= 1 for r in rs[1:])
    finally:
        await f.close()


async def test_fleet_stats_count_bytes_rounds_and_peers(fleet: Fleet) -> None:
    rs = await fleet.start(3)
    rs[0].record("e", [1])
    await fleet.clock.advance(0.5)  # type: ignore[attr-defined]
    st = rs[0].node.stats()
    assert st.peers == {"alive": 2, "suspect": 0, "dead": 0}
    c = st.counters
    assert c.rounds > 0 and c.bytes_out > 0 and c.bytes_in > 0 and c.deltas_published == 1


async def test_fleet_close_cancels_every_task() -> None:
    f = Fleet()
    rs = await f.start(4)
    rs[0].record("e", [1])
    await f.clock.advance(0.3)  # type: ignore[attr-defined]
    await f.close()
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert left == []
    assert all(not r.node.running for r in rs)


async def test_node_virtual_clock_is_deterministic() -> None:
    async def run() -> list[int]:
        f = Fleet(clock=ManualClock(), seed=11)
        rs = await f.start(5)
        for i in range(10):
            rs[i % 5].record("e", [i])
        await f.clock.advance(1.0)  # type: ignore[attr-defined]
        out = [r.node.stats().counters.messages_out for r in rs]
        await f.close()
        return out

    assert await run() == await run()
