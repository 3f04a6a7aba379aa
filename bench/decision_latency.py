"""Decision time: block keys + index lookup + scoring + recording, per prompt size and fleet.

The index is first warmed with unrelated prompts on every engine, and each measured prompt
shares its first half with an earlier one, so the lookup walks real overlaps. With ``--cold``
every prompt is new instead: nobody holds it, and its engine comes from the ring. Times are CPU
time of the calling thread (``time.thread_time_ns``), the figure least disturbed by other
work on a shared machine. Each row is measured twice, back to back: as the router decides
(a shortlist of candidates is scored above ``SHORTLIST_ABOVE`` engines) and scoring every
engine, so the ratio of the two is comparable even when the machine's load is not.

    python -m bench.decision_latency [--engines 8 64 256] [--tokens 1024 8192 32768 131072]
        [--samples 300] [--cold]
"""

from __future__ import annotations

import argparse
import random
import time

from router.core import decision
from router.core.blocks import CHARS_PER_TOKEN
from router.core.decision import RoutingCore
from router.core.policy import load_policy
from router.core.stats import percentile
from router.presets import preset_path


def words(rng: random.Random, chars: int) -> str:
    out = []
    n = 0
    while n < chars:
        w = f"w{rng.getrandbits(20):x} "
        out.append(w)
        n += len(w)
    return "".join(out)[:chars]


def measure(engines: int, tokens: int, samples: int, cold: bool = False) -> tuple[float, float]:
    rng = random.Random(engines * 7 + tokens)
    router = RoutingCore(load_policy(preset_path("kv-aware")))
    names = [f"http://engine-{i}:8000" for i in range(engines)]
    router.set_engines(dict.fromkeys(names, 1))
    chars = tokens * CHARS_PER_TOKEN
    prefixes = [words(rng, chars // 2) for _ in range(8)]
    for i in range(min(engines, 64)):  # warm: every engine holds something
        d = router.decide({"model": "m", "prompt": words(rng, 2048)}, names, now=float(i))
        lease = router.acquire(d, str(d.engine), float(i))
        router.record(lease, float(i))
        router.release(lease)
    bodies = [
        {
            "model": "m",
            "prompt": (words(rng, chars // 2) if cold else rng.choice(prefixes))
            + words(rng, chars - chars // 2),
        }
        for _ in range(samples)
    ]
    clock = time.thread_time_ns
    times = []
    for i, body in enumerate(bodies):
        # The routing work of one request on the event loop: the decision, taking the load,
        # and recording the prefix at the first byte.
        t0 = clock()
        d = router.decide(body, names, now=100.0 + i)
        lease = router.acquire(d, str(d.engine), 100.0 + i)
        router.record(lease, 100.0 + i)
        times.append(clock() - t0)
        router.release(lease)
    return percentile(times, 50) / 1000, percentile(times, 99) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--cold", action="store_true", help="every prompt new: nobody holds it")
    args = ap.parse_args()
    print("| prompt tokens | engines | decision p50 | decision p99 | every engine scored: p50 |")
    print("|---|---|---|---|---|")
    shortlist_above = decision.SHORTLIST_ABOVE
    for tokens in args.tokens:
        for engines in args.engines:
            p50, p99 = measure(engines, tokens, args.samples, args.cold)
            decision.SHORTLIST_ABOVE = 1 << 30
            try:
                all50, _ = measure(engines, tokens, args.samples, args.cold)
            finally:
                decision.SHORTLIST_ABOVE = shortlist_above
            print(
                f"| {tokens:,} | {engines} | {p50:.0f} us | {p99:.0f} us | {all50:.0f} us |",
                flush=True,
            )


if __name__ == "__main__":
    main()
