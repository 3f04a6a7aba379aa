"""Live cache hit ratio of several router replicas, with and without gossip, against one.

Starts ``--engines`` timed ``engine-sim`` processes whose prefix caches are too small for the
trace's working set (the cache is contended: where a request lands decides its hits), then,
for each run, ``kvrouter serve`` replicas in front of all of them:

- ``single``: one replica;
- ``gossip-on``: ``--replicas`` replicas sharing index and load by gossip;
- ``gossip-off``: the same replicas, each on its own.

With ``--picker`` the replicas are endpoint pickers instead (``kvrouter serve --epp-port P
--no-proxy``) behind one Python stand-in for Envoy's data plane
(tests.gateway.extproc.data_plane), which asks them in turns, as Envoy's connections to a
picker Service spread, and forwards to the engine named: after ``single`` (the proxy, the
baseline), ``picker-single`` (one picker) and ``picker-gossip-on`` (``--replicas`` pickers,
gossiping).

A client replays the first ``--requests`` records of a Mooncake trace (each record's blocks
expanded to text by ``router.core.workload``) as completions requests, round-robin over the
replicas as a Kubernetes Service would spread them, with ``--concurrency`` in flight (closed
loop: the trace's timestamps give the order, not the pace). The engines are reset before every
run; the hit ratio is theirs: cached prompt tokens over prompt tokens, from ``GET /stats``.

Every replica runs the kv-aware preset told the engines' real cache size: engine-sim counts
tokens the way the router does, and a Mooncake record's text is one such token per trace token,
so ``--kv-capacity-tokens`` is in the trace's tokens on both sides.

    python -m bench.replicas_hit_ratio [--trace ../shared/data/conversation_trace.jsonl]
        [--requests 3000] [--concurrency 16] [--engines 4] [--replicas 4]
        [--kv-capacity-tokens 800000] [--preset local|lan] [--cold-prefix score|ring]
        [--picker] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
import orjson

from bench.common import GOSSIP_SECRET, alive_peers, markdown_table, print_report
from router.commands.fleet import Proc, http_json, running, start_ready, wait_until
from router.core.workload import from_mooncake
from router.hostport import LOOPBACK, free_ports
from router.presets import preset_text
from tests.gateway.extproc.data_plane import DataPlane

MODEL = "sim-model"
# Engines fast enough for a run of a minute or two on a small machine, with prefill still
# costing more than decode, as on a real GPU. RESULTS.md counts these runs in Mooncake words,
# two of engine-sim's tokens each: its 200,000 prefill tokens/s are these 400,000.
PREFILL_TOKENS_PER_S = 400_000
DECODE_TOKENS_PER_S = 1_000
MAX_BATCH = 16


@dataclass(frozen=True)
class Run:
    name: str
    replicas: int
    gossip: bool
    picker: bool = False


@dataclass(frozen=True)
class Result:
    run: Run
    requests: int
    failed: int
    prompt_tokens: int
    cached_tokens: int
    busiest_share: float  # the busiest engine's requests over the mean
    seconds: float

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def load_bodies(path: Path, n: int, max_tokens: int) -> list[bytes]:
    """The first ``n`` Mooncake records as completions bodies for the engine-sims' model."""
    out = []
    with path.open() as f:
        for i, line in enumerate(itertools.islice(f, n)):
            body = dict(from_mooncake(json.loads(line), f"{path}:{i + 1}").request_body())
            body["model"] = MODEL
            body["max_tokens"] = max(1, min(int(body["max_tokens"]), max_tokens))
            out.append(orjson.dumps(body))
    return out


def write_policy(dest: Path, engine_capacity: int, cold_prefix: str) -> None:
    """The kv-aware preset, told the engines' cache size."""
    settings = {"index.engine_capacity_tokens": engine_capacity, "cold_prefix": cold_prefix}
    dest.write_text(preset_text("kv-aware", settings))


async def replay(bodies: list[bytes], targets: list[str], concurrency: int) -> int:
    """Send every body, round-robin over ``targets``, ``concurrency`` at a time; failures."""
    next_index = itertools.count()
    failed = 0
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def worker() -> None:
            nonlocal failed
            for i in next_index:
                if i >= len(bodies):
                    return
                url = f"{targets[i % len(targets)]}/v1/completions"
                try:
                    async with http.post(url, data=bodies[i], headers=headers) as r:
                        await r.read()
                        failed += r.status != 200
                except aiohttp.ClientError:
                    failed += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failed


def start_replicas(
    run: Run, engines: list[Proc], policy: Path, tmp: Path, procs: list[Proc], preset: str
) -> list[Proc]:
    backends = [a for e in engines for a in ("--backend", e.url)]
    gossip_ports = free_ports(run.replicas)
    epp_ports = free_ports(run.replicas)
    replicas = []
    for i in range(run.replicas):
        args = ["serve", "--host", LOOPBACK, "--policy", str(policy), *backends]
        args += ["--log-level", "warning"]
        if run.picker:
            args += ["--epp-port", str(epp_ports[i]), "--no-proxy"]
        if run.gossip:
            args += ["--gossip-port", str(gossip_ports[i]), "--gossip-preset", preset]
            if i:
                args += ["--gossip-peer", f"{LOOPBACK}:{gossip_ports[0]}"]
        env = {"KVROUTER_GOSSIP_SECRET": GOSSIP_SECRET}
        proc = start_ready(args, tmp, env=env, ready_path="/ready", timeout=60)
        procs.append(proc)
        replicas.append(proc)
    for proc in replicas:
        wait_until(partial(ready_on, proc, len(engines)), f"every engine healthy at {proc.url}", 60)
        if run.gossip:
            wait_until(partial(sees, proc, run.replicas - 1), f"{proc.url} sees the rest", 60)
    return replicas


def epp_ports_of(replicas: list[Proc]) -> list[int]:
    ports = []
    for r in replicas:
        args = [str(a) for a in r.popen.args]  # type: ignore[union-attr]
        ports.append(int(args[args.index("--epp-port") + 1]))
    return ports


async def replay_behind_envoy(bodies: list[bytes], pickers: list[str], concurrency: int) -> int:
    """``replay`` through one Envoy stand-in asking ``pickers`` in turns."""
    async with DataPlane(pickers).running() as dp:
        return await replay(bodies, [dp.url], concurrency)


def ready_on(proc: Proc, engines: int) -> bool:
    return bool(http_json(f"{proc.url}/ready")["healthy_backends"] == engines)


def sees(proc: Proc, peers: int) -> bool:
    return alive_peers(proc) == peers


def one_run(
    run: Run,
    bodies: list[bytes],
    engines: list[Proc],
    policy: Path,
    tmp: Path,
    concurrency: int,
    preset: str,
) -> Result:
    for e in engines:
        http_json(f"{e.url}/reset", {})
    with running([]) as procs:
        replicas = start_replicas(run, engines, policy, tmp, procs, preset)
        t0 = time.perf_counter()
        if run.picker:
            pickers = [f"{LOOPBACK}:{p}" for p in epp_ports_of(replicas)]
            failed = asyncio.run(replay_behind_envoy(bodies, pickers, concurrency))
        else:
            failed = asyncio.run(replay(bodies, [r.url for r in replicas], concurrency))
        seconds = time.perf_counter() - t0
        for r in replicas:
            if r.stop() != 0:
                raise RuntimeError(f"replica {r.url} did not exit cleanly:\n{r.log()[-2000:]}")
    stats = [http_json(f"{e.url}/stats") for e in engines]
    counts = [s["requests"] for s in stats]
    mean = sum(counts) / len(counts)
    return Result(
        run=run,
        requests=len(bodies),
        failed=failed,
        prompt_tokens=sum(s["prompt_tokens"] for s in stats),
        cached_tokens=sum(s["cached_tokens"] for s in stats),
        busiest_share=max(counts) / mean if mean else 0.0,
        seconds=seconds,
    )


def table(results: list[Result]) -> str:
    single = next((r.hit_ratio for r in results if r.run.name == "single"), 0.0)
    head = ["run", "replicas", "gossip", "requests", "failed", "hit ratio", "vs single"]
    head += ["busiest/mean", "req/s"]
    rows = [
        [
            r.run.name,
            str(r.run.replicas),
            "on" if r.run.gossip else "off",
            str(r.requests),
            str(r.failed),
            f"{r.hit_ratio:.4f}",
            f"{r.hit_ratio / single:.3f}" if single else "-",
            f"{r.busiest_share:.2f}",
            f"{r.requests / r.seconds:.1f}",
        ]
        for r in results
    ]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/conversation_trace.jsonl")
    p.add_argument("--requests", type=int, default=3000, help="first N records of the trace")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=800_000,
        help="each engine's prefix cache, in tokens",
    )
    p.add_argument("--max-tokens", type=int, default=16, help="cap on each request's output")
    p.add_argument(
        "--preset",
        default="local",
        choices=("local", "lan"),
        help="gossip timing (local: replicas on one host, as here; lan: the cluster default)",
    )
    p.add_argument(
        "--cold-prefix",
        default="score",
        choices=("score", "ring"),
        help="the policy's cold_prefix (score: the kv-aware preset as shipped)",
    )
    p.add_argument(
        "--picker",
        action="store_true",
        help="replicas as endpoint pickers behind an Envoy stand-in (after the proxy baseline)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = p.parse_args(argv)

    bodies = load_bodies(Path(args.trace), args.requests, args.max_tokens)
    runs = [
        Run("single", 1, gossip=False),
        Run("gossip-on", args.replicas, gossip=True),
        Run("gossip-off", args.replicas, gossip=False),
    ]
    if args.picker:
        runs = [
            Run("single", 1, gossip=False),
            Run("picker-single", 1, gossip=False, picker=True),
            Run("picker-gossip-on", args.replicas, gossip=True, picker=True),
        ]
    engine_flags = [
        "--kv-capacity-tokens", str(args.kv_capacity_tokens),
        "--prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S),
        "--decode-tokens-per-s", str(DECODE_TOKENS_PER_S),
        "--max-batch", str(MAX_BATCH),
        "--model", MODEL,
    ]  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        tmp_path = Path(tmp)
        engines = [
            start_ready(["engine-sim", *engine_flags], tmp_path) for _ in range(args.engines)
        ]
        procs.extend(engines)
        policy = tmp_path / "policy.yaml"
        write_policy(policy, args.kv_capacity_tokens, args.cold_prefix)
        for run in runs:
            r = one_run(run, bodies, engines, policy, tmp_path, args.concurrency, args.preset)
            print(
                f"{run.name}: hit ratio {r.hit_ratio:.4f}, {r.failed} failed, {r.seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)

    title = (
        f"{args.requests} requests of {Path(args.trace).name}, {args.engines} engine-sims "
        f"({args.kv_capacity_tokens:,} tokens of cache each), concurrency {args.concurrency}, "
        f"round-robin over the replicas, gossip preset {args.preset}, "
        f"kv-aware with cold_prefix: {args.cold_prefix}"
    )
    records = [
        {
            "run": r.run.name,
            "replicas": r.run.replicas,
            "gossip": r.run.gossip,
            "hit_ratio": r.hit_ratio,
            "failed": r.failed,
            "busiest_share": r.busiest_share,
            "seconds": r.seconds,
        }
        for r in results
    ]
    print_report(title, table(results), records if args.json else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
