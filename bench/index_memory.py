"""Index memory per (block, engine) entry at 1M entries (tracemalloc, keys made inside).

python -m bench.index_memory [--entries 1000000] [--engines 64]
"""

from __future__ import annotations

import argparse
import random
import tracemalloc

from router.core.index import BlockIndex, IndexLimits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--chain", type=int, default=64, help="blocks per recorded prompt")
    ap.add_argument("--shared", type=float, default=0.0, help="share of chains on 2 engines")
    args = ap.parse_args()
    rng = random.Random(1)
    idx = BlockIndex(IndexLimits(engine_capacity_blocks=10**9, max_entries=10**9))
    names = [f"http://engine-{i}:8000" for i in range(args.engines)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    i = 0
    while len(idx) < args.entries:
        chain = [rng.getrandbits(64) for _ in range(args.chain)]
        idx.confirm(names[i % len(names)], chain, now=float(i))
        if rng.random() < args.shared:
            idx.confirm(names[(i + 1) % len(names)], chain, now=float(i))
        i += 1
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"entries {len(idx):,}  engines {args.engines}  shared {args.shared:.0%}")
    print(f"bytes per entry {used / len(idx):.1f}  total {used / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
