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

Usage: python bench/gossip_convergence.py [--sizes 3 8 16 32] [--rate 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
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


async def run_fleet(n: int, args: argparse.Namespace) -> Result:
    clock = ManualClock()
    fleet = Fleet(tuning=args.tuning, clock=clock, seed=args.seed)
    rng = random.Random(args.seed)
    try:
        replicas = await fleet.start(n)
        joined = await fleet.settle(
            lambda: all(r.node.stats().peers["alive"] == n - 1 for r in replicas), 60.0, 0.05
        )
        if not joined:
            raise RuntimeError(f"{n} replicas did not see each other within 60 s")
        await clock.advance(2.0)  # past the joining traffic

        arrivals: dict[tuple[str, int], list[float]] = {}

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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    changes = {}
    for item in args.set:
        name, _, value = item.partition("=")
        kind = type(getattr(LAN, name))
        changes[name] = kind(value)
    args.tuning = dataclasses.replace(LAN, **changes)
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
