"""Gossip convergence and bandwidth for 3, 8, 16 and 32 in-process replicas.

Each replica is a real BlockIndex + LoadBook + IndexDelegate + GossipNode (the LAN preset, i.e.
the default settings); they talk over the in-memory network on a virtual clock, so the
numbers are the protocol's, not this machine's CPU's. The fleet routes ``--rate`` requests/s
in total (each picks a random replica, records ``--keys`` blocks on one of ``--engines``
engines, and holds load for ``--hold`` s). Reported per fleet size:

- convergence: for every delta made during the run, the time from ``record`` on its replica
  until the last other replica applied it (p50, p99, max), and the share that reached all;
- bandwidth: gossip bytes sent per replica per second while the load runs (envelopes as they
  cross the wire, MACs and framing included), and messages per replica per second.

With ``--partition S``, replica r0 is cut off from all the others for S seconds (the
network drops everything between them, both ways) while every replica, r0 included, keeps
routing; then the network heals. Each replica also holds a fixed load (r_i: i + 1 requests on
one engine) from start to end, and new requests stop one ``--hold`` before the heal, so that
at the heal the held load is the fleet's true in-flight load. Reported per fleet size: the
deltas made during the cut and the share that reached every replica; from the heal, the
time until every replica sees every other alive, until each of those deltas reached every
replica (p50, p99, max), and until every replica's view of the fleet's load is the true one;
whether, during the cut, each side's view was its own side's load only; snapshots taken.

Usage: python bench/gossip_convergence.py [--sizes 3 8 16 32] [--rate 1000] [--seconds 5]
       python bench/gossip_convergence.py --partition 30 [--sizes 3 8]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from router.core.stats import percentile
from router.gateway.replicas.in_process import Fleet, Replica
from router.gossip.clock import ManualClock
from router.gossip.config import LAN
from router.gossip.wire import pb


@dataclass(frozen=True)
class Result:
    replicas: int
    deltas: int
    reached_all: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    bytes_out_per_replica_s: float
    messages_out_per_replica_s: float
    snapshots: int


@dataclass(frozen=True)
class PartitionResult:
    replicas: int
    cut_s: float
    deltas_during_cut: int
    by_deltas: float
    snapshots: int
    sides_apart: bool
    members_ms: float
    index_ms: float
    load_ms: float


# Seconds for load reports to settle (a few of the LAN preset's load intervals) before the
# views are compared at the end of the cut.
LOAD_SETTLE = 2.0


# Delta id -> [replicas that applied it, when the last one did].
Arrivals = dict[tuple[str, int], list[float]]


async def joined_fleet(n: int, args: argparse.Namespace) -> tuple[Fleet, list[Replica]]:
    """``n`` replicas on a virtual clock, every one seeing every other alive."""
    fleet = Fleet(tuning=args.tuning, clock=ManualClock(), seed=args.seed)
    replicas = await fleet.start(n)
    if not await fleet.settle(lambda: all_alive(replicas, n - 1), 60.0, 0.05):
        await fleet.close()
        raise RuntimeError(f"{n} replicas did not see each other within 60 s")
    return fleet, replicas


def all_alive(replicas: list[Replica], alive: int) -> bool:
    return all(r.node.stats().peers["alive"] == alive for r in replicas)


def track(replicas: list[Replica], clock: ManualClock) -> Arrivals:
    """Count every replica's merge of the deltas entered in the returned table."""
    arrivals: Arrivals = {}

    def hook(replica: Replica) -> None:
        merge = replica.bridge.merge_delta

        def counted(delta: pb.Delta) -> None:
            entry = arrivals.get((delta.origin, delta.seq))
            if entry is not None:
                entry[0] += 1
                entry[1] = clock.now()
            merge(delta)

        replica.bridge.merge_delta = counted  # type: ignore[method-assign]

    for r in replicas:
        hook(r)
    return arrivals


async def run_fleet(n: int, args: argparse.Namespace) -> Result:
    fleet, replicas = await joined_fleet(n, args)
    clock = fleet.clock
    assert isinstance(clock, ManualClock)
    rng = random.Random(args.seed)
    try:
        await clock.advance(2.0)  # past the joining traffic
        arrivals = track(replicas, clock)

        prefixes = [[rng.getrandbits(64) for _ in range(args.keys // 4)] for _ in range(32)]
        engines = [f"engine-{i}" for i in range(args.engines)]
        created: dict[tuple[str, int], float] = {}
        holds: list[tuple[float, Replica, str, int]] = []
        sent0 = [r.node.stats().counters for r in replicas]
        per_step = args.rate * args.step
        owed = 0.0
        steps = int(args.seconds / args.step)
        for _ in range(steps):
            now = clock.now()
            owed += per_step
            while owed >= 1:
                owed -= 1
                r = rng.choice(replicas)
                keys = rng.choice(prefixes) + [
                    rng.getrandbits(64) for _ in range(args.keys - args.keys // 4)
                ]
                engine = rng.choice(engines)
                delta = r.record(engine, keys, now)
                created[(delta.origin, delta.seq)] = now
                arrivals[(delta.origin, delta.seq)] = [0, now]
                r.loads.acquire(engine, args.keys * 16)
                holds.append((now + args.hold, r, engine, args.keys * 16))
            while holds and holds[0][0] <= now:
                _, r, engine, tokens = holds.pop(0)
                r.loads.release(engine, tokens)
            await clock.advance(args.step)
        sent1 = [r.node.stats().counters for r in replicas]

        await fleet.settle(lambda: all(a[0] >= n - 1 for a in arrivals.values()), 30.0, 0.05)
        done = [a[1] - created[k] for k, a in arrivals.items() if a[0] >= n - 1]
        bytes_out = sum(b.bytes_out - a.bytes_out for a, b in zip(sent0, sent1, strict=True))
        msgs_out = sum(b.messages_out - a.messages_out for a, b in zip(sent0, sent1, strict=True))
        return Result(
            replicas=n,
            deltas=len(created),
            reached_all=len(done) / max(1, len(created)),
            p50_ms=1000 * statistics.median(done) if done else float("nan"),
            p99_ms=1000 * percentile(done, 99) if done else float("nan"),
            max_ms=1000 * max(done, default=float("nan")),
            bytes_out_per_replica_s=bytes_out / n / args.seconds,
            messages_out_per_replica_s=msgs_out / n / args.seconds,
            snapshots=sum(r.node.stats().counters.snapshots_received for r in replicas),
        )
    finally:
        await fleet.close()


async def run_partition(n: int, args: argparse.Namespace) -> PartitionResult:
    fleet, replicas = await joined_fleet(n, args)
    clock = fleet.clock
    assert isinstance(clock, ManualClock)
    rng = random.Random(args.seed)
    lone, rest = replicas[0], replicas[1:]
    engines = [f"engine-{i}" for i in range(args.engines)]
    try:
        await clock.advance(2.0)
        arrivals = track(replicas, clock)
        for i, r in enumerate(replicas):
            for _ in range(i + 1):
                r.loads.acquire(engines[0], 100)
        held = {e: sum(r.loads.local(e).requests for r in replicas) for e in engines}

        def views_are(replica: Replica, truth: dict[str, int]) -> bool:
            return all(replica.loads.total(e).requests == truth[e] for e in engines)

        for a in rest:
            fleet.network.partition(lone.address, a.address)
        heal_at = clock.now() + args.partition
        stop_at = heal_at - args.hold - LOAD_SETTLE
        created: set[tuple[str, int]] = set()
        holds: list[tuple[float, Replica, str, int]] = []
        owed = 0.0
        while clock.now() + args.step < heal_at:
            now = clock.now()
            owed += args.rate * args.step if now < stop_at else 0.0
            while owed >= 1:
                owed -= 1
                r = rng.choice(replicas)
                engine = rng.choice(engines)
                delta = r.record(engine, [rng.getrandbits(64) for _ in range(args.keys)], now)
                created.add((delta.origin, delta.seq))
                arrivals[(delta.origin, delta.seq)] = [0, now]
                r.loads.acquire(engine, args.keys * 16)
                holds.append((now + args.hold, r, engine, args.keys * 16))
            while holds and holds[0][0] <= now:
                _, r, engine, tokens = holds.pop(0)
                r.loads.release(engine, tokens)
            await clock.advance(args.step)
        # Just before the heal, each side counts its own side's held load and nothing more.
        mine = {e: lone.loads.local(e).requests for e in engines}
        theirs = {e: held[e] - mine[e] for e in engines}
        apart = not holds and views_are(lone, mine) and all(views_are(a, theirs) for a in rest)
        blocks = len(created) * args.keys
        fleet.network.heal()
        healed = clock.now()

        # From the heal, the first moment each holds (nan: not within two minutes).
        checks: dict[str, Callable[[], bool]] = {
            "members": lambda: all_alive(replicas, n - 1),
            "load": lambda: all(views_are(r, held) for r in replicas),
            "index": lambda: all(len(r.index) == blocks for r in replicas),
        }
        held_at: dict[str, float] = {}
        while len(held_at) < len(checks) and clock.now() - healed < 120.0:
            for name, check in checks.items():
                if name not in held_at and check():
                    held_at[name] = 1000 * (clock.now() - healed)
            await clock.advance(args.step)
        members, load, index = (held_at.get(k, float("nan")) for k in checks)
        return PartitionResult(
            replicas=n,
            cut_s=args.partition,
            deltas_during_cut=len(created),
            by_deltas=sum(arrivals[k][0] >= n - 1 for k in created) / max(1, len(created)),
            snapshots=sum(r.node.stats().counters.snapshots_received for r in replicas),
            sides_apart=apart,
            members_ms=members,
            index_ms=index,
            load_ms=load,
        )
    finally:
        await fleet.close()


def print_partitions(results: list[PartitionResult], args: argparse.Namespace) -> None:
    print(
        f"r0 cut off from the other replicas for {args.partition:g} s under "
        f"{args.rate:g} requests/s across the fleet ({args.keys} blocks each), then healed; "
        f"LAN preset{' with ' + ', '.join(args.set) if args.set else ''}"
    )
    print(
        f"{'replicas':>8} {'cut deltas':>10} {'by deltas':>9} {'snapshots':>9} {'apart':>5} "
        f"| from the heal: {'members ms':>10} {'index ms':>8} {'load ms':>7}"
    )
    for r in results:
        print(
            f"{r.replicas:>8} {r.deltas_during_cut:>10} {r.by_deltas:>9.2%} {r.snapshots:>9} "
            f"{'yes' if r.sides_apart else 'NO':>5} | {'':>14} {r.members_ms:>10.0f} "
            f"{r.index_ms:>8.0f} {r.load_ms:>7.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 8, 16, 32])
    parser.add_argument("--rate", type=float, default=1000.0, help="routed requests/s, fleet")
    parser.add_argument("--seconds", type=float, default=5.0, help="virtual seconds of load")
    parser.add_argument("--keys", type=int, default=64, help="blocks per request")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--hold", type=float, default=2.0, help="seconds a request is in flight")
    parser.add_argument("--step", type=float, default=0.005, help="virtual clock step")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override LAN tuning"
    )
    parser.add_argument(
        "--partition", type=float, default=0.0, metavar="S", help="cut r0 off for S seconds"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    changes = {}
    for item in args.set:
        name, _, value = item.partition("=")
        kind = type(getattr(LAN, name))
        changes[name] = kind(value)
    args.tuning = dataclasses.replace(LAN, **changes)
    if args.partition > 0:
        cuts = [asyncio.run(run_partition(n, args)) for n in args.sizes]
        if args.json:
            print(json.dumps([asdict(r) for r in cuts], indent=2))
        else:
            print_partitions(cuts, args)
        return 0
    results = [asyncio.run(run_fleet(n, args)) for n in args.sizes]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    t = args.tuning
    print(
        f"{args.rate:g} requests/s across the fleet, {args.keys} blocks each, "
        f"{args.seconds:g} s, LAN preset{' with ' + ', '.join(args.set) if args.set else ''} "
        f"(gossip every {t.gossip_interval * 1000:g} ms, fanout {t.fanout}, "
        f"retransmit mult {t.retransmit_mult}, push-pull every {t.push_pull_interval:g} s)"
    )
    print(
        f"{'replicas':>8} {'deltas':>7} {'reached':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'KiB/s out/replica':>18} {'msgs/s/replica':>15}"
    )
    for r in results:
        print(
            f"{r.replicas:>8} {r.deltas:>7} {r.reached_all:>8.2%} {r.p50_ms:>7.0f} "
            f"{r.p99_ms:>7.0f} {r.max_ms:>7.0f} {r.bytes_out_per_replica_s / 1024:>18.1f} "
            f"{r.messages_out_per_replica_s:>15.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
