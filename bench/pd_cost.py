"""What a disaggregated request costs the router: its CPU, its engine round trips, its TTFT.

Side by side in one run, each in front of ``engine-sim --fast`` engines (no model delays, so
what is measured is the router's plumbing):

- aggregated: two engines that do both;
- vllm: a prefill and a decode engine, every request split (``decider: always``): the
  prefill request, read whole, then the decode request, relayed;
- sglang: the same with SGLang's engines (``--kind sglang``), the two requests sent at once.

With ``--pace N`` the engines stream N tokens a second, each its own chunk, as a served
model does (the relay's per-chunk work then counts as it does in production).

Each router takes ``--requests`` streamed chat requests at ``--concurrency`` per round, the
routers' order rotated each round; CPU is the router process's utime + stime. Engine round
trips per request are the engines' own request counts (``/stats``) over the client's
requests. Then one request at a time, in turns, for the TTFT each path adds.

    python -m bench.pd_cost [--requests 1000] [--concurrency 32] [--rounds 3] [--latency 200]
        [--pace 0] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from bench.common import chat_body, closed_loop, interleaved, tree_cpu_seconds
from router.commands.fleet import Proc, running, start_ready
from router.core.stats import percentile
from router.hostport import LOOPBACK

SETUPS = ("aggregated", "vllm", "sglang")
# Split every request, whatever it would cost: what is measured is the split path itself.
CONFIG = {
    "vllm": "disaggregation: {protocol: vllm, decider: always}\n",
    "sglang": "disaggregation: {protocol: sglang, decider: always}\n",
}


def stats(engine: Proc) -> dict[str, object]:
    with urllib.request.urlopen(f"{engine.url}/stats", timeout=5) as r:
        out: dict[str, object] = json.loads(r.read())
        return out


def engine_requests(engines: Sequence[Proc]) -> int:
    """Generation requests the engines have taken, by their own count."""
    total = 0
    for e in engines:
        s = stats(e)
        value = s.get("requests", 0)
        total += int(value) if isinstance(value, int) else 0
    return total


def fleet(setup: str, tmp: Path, procs: list[Proc], pace: float) -> tuple[Proc, list[Proc]]:
    """The router of ``setup`` and its engines, started and ready; ``pace``: tokens a second
    per stream, each its own chunk (0: ``--fast``)."""
    timing = ["--fast"]
    if pace:
        timing = ["--prefill-tokens-per-s", "1e12", "--decode-tokens-per-s", f"{pace:g}"]

    def sim(*extra: str) -> Proc:
        p = start_ready(["engine-sim", *timing, *extra], tmp, name=f"{setup}-engine")
        procs.append(p)
        return p

    base = ["serve", "--host", LOOPBACK, "--log-level", "warning"]
    if setup == "aggregated":
        engines = [sim(), sim()]
        args = [*base, "--engine", engines[0].url, "--engine", engines[1].url]
    else:
        kind = ["--kind", setup]
        prefill, decode = sim("--role", "prefill", *kind), sim("--role", "decode", *kind)
        engines = [prefill, decode]
        config = tmp / f"{setup}.yaml"
        config.write_text(CONFIG[setup])
        port = stats(prefill).get("bootstrap_port")
        pre = ["--prefill", prefill.url, *([str(port)] if port else [])]
        args = [*base, "--config", str(config), *pre, "--decode", decode.url]
    router = start_ready(args, tmp, ready_path="/ready", name=f"{setup}-router")
    procs.append(router)
    return router, engines


def constant(url: str) -> Callable[[int], str]:
    """Every request number goes to ``url``."""
    return lambda _i: url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=int, default=200, help="one-at-a-time requests")
    ap.add_argument("--prompt-chars", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--pace", type=float, default=0.0, help="tokens/s per stream (0: --fast)")
    args = ap.parse_args(argv)
    cpu: dict[str, list[float]] = {s: [] for s in SETUPS}
    trips: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        setups = {s: fleet(s, Path(tmp), procs, args.pace) for s in SETUPS}

        def body(i: int) -> dict[str, object]:
            return chat_body(i, args.prompt_chars, args.max_tokens)

        for n in range(args.rounds):
            for s in SETUPS[n % len(SETUPS) :] + SETUPS[: n % len(SETUPS)]:
                router, engines = setups[s]
                before = engine_requests(engines)
                r = asyncio.run(
                    closed_loop(
                        constant(router.url),
                        args.requests,
                        args.concurrency,
                        body,
                        partial(tree_cpu_seconds, router.popen.pid),
                    )
                )
                if r.failures:
                    raise SystemExit(f"{s}: {r.failures} requests failed")
                cpu[s].append(r.cpu_ms_per_request or 0.0)
                trips[s] = (engine_requests(engines) - before) / max(1, r.requests)
        paths = {s: constant(setups[s][0].url) for s in SETUPS}
        timings = asyncio.run(interleaved(paths, args.latency, body))
    base = cpu["aggregated"]
    timing = f"{args.pace:g} tokens/s per stream" if args.pace else "engine-sim --fast"
    print(
        f"Router CPU per streamed request ({timing}, {args.max_tokens} tokens), "
        f"{args.rounds} rounds of {args.requests} at concurrency {args.concurrency}; "
        f"then {args.latency} requests one at a time"
    )
    print("| setup | CPU ms/req per round | median ratio to aggregated | engine requests per "
          "request | TTFT p50 | TTFT p99 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for s in SETUPS:
        ratio = statistics.median(c / b for c, b in zip(cpu[s], base, strict=True))
        ttfts = [t.ttft for t in timings[s]]
        print(
            f"| {s} | {' '.join(f'{c:.3f}' for c in cpu[s])} | {ratio:.2f} | {trips[s]:.2f} | "
            f"{percentile(ttfts, 50) * 1000:.2f} ms | {percentile(ttfts, 99) * 1000:.2f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
