"""Decision time: block keys + index lookup + scoring + taking the load + recording, per prompt
size and fleet.

The index is first warmed with unrelated prompts on every engine, and each measured prompt
shares its first half with an earlier one, so the lookup walks real overlaps. With ``--cold``
every prompt is new instead: nobody holds it, and its engine comes from the ring. Times are CPU
time of the calling thread (``time.thread_time_ns``).

The machines this runs on change speed from one second to the next (a shared VM ran the same
code 1.6x slower for seconds at a time), so figures to be compared are never taken one after
the other: every row runs its variants side by side, each in a worker process of its own
(the same heap and collector work for each), in turns of ``BATCH`` decisions, so each
variant's p50 comes from the same stretch of time as the others':

- as the router decides (a shortlist of candidates is scored above ``SHORTLIST_ABOVE``), with
  the compiled hot loops (``router.core.hotpath``) when they are built;
- scoring every engine (the same code);
- the pure-Python reference of the hot loops (``KVROUTER_PURE_PYTHON=1``);
- with ``--baseline DIR``, the code of another checkout (``git worktree add DIR COMMIT``):
  this file's ``Bench`` against that checkout's ``router`` package and its
  ``policies/kv-aware.yaml``.

    python -m bench.decision_latency [--engines 8 64 256] [--tokens 1024 8192 32768 131072]
        [--samples 300] [--cold] [--baseline DIR]

``--identical TRACE`` replays a trace (Mooncake or OpenAI-body JSONL) through the simulator
twice, compiled and pure, and counts the requests routed to the same engine by both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from router.core import decision
from router.core.blocks import CHARS_PER_TOKEN
from router.core.decision import RoutingCore
from router.core.stats import percentile
from router.yaml_files import load_policy

BATCH = 25  # decisions per turn: short enough that a variant never runs alone for long
POLICY = Path("policies") / "kv-aware.yaml"
# router.core.hotpath's switch, spelled out: the baseline's workers import this file too.
PURE_PYTHON_VARIABLE = "KVROUTER_PURE_PYTHON"


def words(rng: random.Random, chars: int) -> str:
    out = []
    n = 0
    while n < chars:
        w = f"w{rng.getrandbits(20):x} "
        out.append(w)
        n += len(w)
    return "".join(out)[:chars]


class Bench:
    """One warmed router and its prompts; ``run(n)`` times the next ``n`` requests."""

    def __init__(self, root: Path, engines: int, tokens: int, samples: int, cold: bool) -> None:
        rng = random.Random(engines * 7 + tokens)
        self.router = RoutingCore(load_policy(root / POLICY))
        self.names = [f"http://engine-{i}:8000" for i in range(engines)]
        self.router.set_engines(dict.fromkeys(self.names, 1))
        chars = tokens * CHARS_PER_TOKEN
        prefixes = [words(rng, chars // 2) for _ in range(8)]
        for i in range(min(engines, 64)):  # warm: every engine holds something
            self._request({"model": "m", "prompt": words(rng, 2048)}, float(i))
        self.bodies = [
            {
                "model": "m",
                "prompt": (words(rng, chars // 2) if cold else rng.choice(prefixes))
                + words(rng, chars - chars // 2),
            }
            for _ in range(samples)
        ]
        self.next = 0

    def _request(self, body: dict[str, str], now: float) -> None:
        # The routing work of one request on the event loop: the decision, taking the load,
        # and recording the prefix at the first byte.
        d = self.router.decide(body, self.names, now=now)
        lease = self.router.acquire(d, str(d.engine), now)
        self.router.record(lease, now)
        self.router.release(lease)

    def run(self, n: int) -> list[int]:
        clock = time.thread_time_ns
        times = []
        for body in self.bodies[self.next : self.next + n]:
            now = 100.0 + self.next
            t0 = clock()
            self._request(body, now)
            times.append(clock() - t0)
            self.next += 1
        return times


class Worker:
    """A ``Bench`` in a process of its own, against the ``router`` of checkout ``root``
    (``every_engine``: with no shortlist, every engine scored)."""

    def __init__(
        self,
        root: Path,
        engines: int,
        tokens: int,
        samples: int,
        cold: bool,
        every_engine: bool = False,
        pure: bool = False,
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(root)}
        if pure:
            env[PURE_PYTHON_VARIABLE] = "1"
        args = [str(root), str(engines), str(tokens), str(samples), str(int(cold))]
        args.append(str(int(every_engine)))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
        )

    def run(self, n: int) -> list[int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the baseline worker died (see its error above)")
        times: list[int] = json.loads(line)
        return times

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def serve_worker(argv: list[str], lines: IO[str]) -> None:
    """The worker's side: build the bench, then time as many requests as each line asks."""
    root, engines, tokens, samples, cold, every_engine = argv
    if every_engine == "1":
        decision.SHORTLIST_ABOVE = 1 << 30
    bench = Bench(Path(root), int(engines), int(tokens), int(samples), cold == "1")
    for line in lines:
        print(json.dumps(bench.run(int(line))), flush=True)


def measure(variants: list[Worker], samples: int) -> list[list[int]]:
    """Each variant's times, taken in turns of ``BATCH`` requests."""
    out: list[list[int]] = [[] for _ in variants]
    for _ in range(0, samples, BATCH):
        for times, v in zip(out, variants, strict=True):
            times.extend(v.run(BATCH))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--cold", action="store_true", help="every prompt new: nobody holds it")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare against, side by side")
    ap.add_argument("--identical", type=Path, metavar="TRACE", help="compare decisions only")
    args = ap.parse_args()
    if args.identical:
        identical(args.identical, args.engines)
        return
    here = Path(__file__).resolve().parent.parent
    head = "| prompt tokens | engines | decision p50 | decision p99 | every engine scored: p50 |"
    head += " pure Python: p50 | this / pure |"
    rule = "|---|---|---|---|---|---|---|"
    if args.baseline:
        head += " baseline p50 | this / baseline |"
        rule += "---|---|"
    print(head)
    print(rule)
    for tokens in args.tokens:
        for engines in args.engines:
            setting = (engines, tokens, args.samples, args.cold)
            variants = [
                Worker(here, *setting),
                Worker(here, *setting, every_engine=True),
                Worker(here, *setting, pure=True),
            ]
            if args.baseline:
                variants.append(Worker(args.baseline.resolve(), *setting))
            times = measure(variants, args.samples)
            for w in variants:
                w.close()
            p50s = [percentile(t, 50) / 1000 for t in times]
            row = f"| {tokens:,} | {engines} | {p50s[0]:.0f} us | "
            row += f"{percentile(times[0], 99) / 1000:.0f} us | {p50s[1]:.0f} us |"
            row += f" {p50s[2]:.0f} us | {p50s[0] / p50s[2]:.2f} |"
            if args.baseline:
                row += f" {p50s[3]:.0f} us | {p50s[0] / p50s[3]:.2f} |"
            print(row, flush=True)


def identical(trace_file: Path, fleets: list[int]) -> None:
    """Route ``trace_file`` compiled and pure on each fleet size; print how many agree."""
    # Here, not at the top: the baseline's workers import this file, and its router has no
    # hotpath.
    from router.commands.traces import read_trace
    from router.core import hotpath
    from router.core.engine_model import EngineSpec
    from router.core.simulator import Fleet, simulate_policy
    from router.core.verdict import Decision

    trace = read_trace(trace_file)
    policy = load_policy(Path(__file__).resolve().parent.parent / POLICY)
    picks: list[str | None] = []
    decide = RoutingCore.decide

    def recording(core: RoutingCore, *args: Any, **kwargs: Any) -> Decision:
        d = decide(core, *args, **kwargs)
        picks.append(d.engine)
        return d

    RoutingCore.decide = recording  # type: ignore[method-assign,assignment]
    print("| trace | engines | requests | same engine, compiled and pure |")
    print("|---|---|---|---|")
    for engines in fleets:
        fleet = Fleet(engines, EngineSpec(capacity_tokens=400_000))
        simulate_policy(policy, trace, fleet)
        fast = picks[:]
        picks.clear()
        saved, hotpath.native = hotpath.native, None
        try:
            simulate_policy(policy, trace, fleet)
        finally:
            hotpath.native = saved
        same = sum(a == b for a, b in zip(fast, picks, strict=True))
        print(f"| {trace_file.name} | {engines} | {len(fast):,} | {same:,} |", flush=True)
        picks.clear()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        serve_worker(sys.argv[2:], sys.stdin)
    else:
        main()
