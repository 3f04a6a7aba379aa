"""kvrouter in front of real vLLM engines, against vLLM's own router, on the same engines.

Two vLLM OpenAI servers (vLLM's CPU build, ``--load-format dummy``: random weights, so the
answers are noise but the prefix cache, its KV events, ``/metrics``, ``/tokenize`` and the
chat template are vLLM's own), each on a core of its own, prefix caching on, cached-token
details in ``usage``, KV events over ZMQ with a replay endpoint. The routers, one at a time on
the same engines, their prefix caches reset in between:

- kvrouter round-robin; kv-aware on its own predictions (approximate); kv-aware with the
  engines' KV events and their ``/tokenize`` (precise);
- vLLM's router (``vllm-router``, the ``bench`` extra): ``cache_aware``, and ``kv_aware`` on
  the same KV events.

The workload is multi-tenant, multi-turn chat (``SyntheticSpec``), replayed open-loop, each
conversation's turns in order, streamed. It prints per router the share of prompt tokens the
engines reported cached (``usage.prompt_tokens_details.cached_tokens``), TTFT p50 and p99 at
the client, failures, and each engine's share of the requests.

    python -m bench.vllm_live --vllm-python VENV/bin/python --model DIR \\
        [--requests 400] [--rate 2] [--num-blocks 0] [--routers kvrouter vllm-router]

``--model`` is any Llama-architecture folder vLLM loads with dummy weights: a config.json and a
tokenizer with a chat template. ``--num-blocks`` overrides the engines' cache size in blocks
(vLLM's CPU backend: 128 tokens each), to make them evict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Streamed, markdown_table, replay_conversations
from router.commands.fleet import Proc, metric, running, start, start_ready, wait_until
from router.core.stats import percentile
from router.core.workload import SyntheticSpec, synthetic
from router.hostport import LOOPBACK, free_port

MODEL = "tiny"
STARTUP_SECONDS = 300.0
HEAD = ["router", "hit ratio", "TTFT p50", "TTFT p99", "failed", "requests per engine"]


def start_vllm(
    python: str, model: Path, core: int, tmp: Path, num_blocks: int
) -> tuple[Proc, str, str]:
    """One vLLM server bound to ``core``; (process, its events endpoint, its replay endpoint)."""
    port, events, replay = free_port(), free_port(), free_port()
    # vLLM binds only wildcard endpoints (it connects its publisher to anything else).
    kv = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv-events",
    }
    args = [
        "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--load-format", "dummy", "--dtype", "bfloat16",
        "--max-model-len", "4096", "--max-num-seqs", "8", "--enable-prefix-caching",
        "--enable-prompt-tokens-details", "--enforce-eager", "--kv-events-config", json.dumps(kv),
    ]  # fmt: skip
    if num_blocks:
        args += ["--num-gpu-blocks-override", str(num_blocks)]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache between routers
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    proc = start(args, tmp, name=f"vllm-{core}", port=port, host=LOOPBACK, command=[python],
                 env=env, cwd=tmp)  # fmt: skip
    wait_until(lambda: _healthy(proc), f"vLLM on core {core}", STARTUP_SECONDS)
    return proc, f"tcp://{LOOPBACK}:{events}", f"tcp://{LOOPBACK}:{replay}"


def _healthy(proc: Proc) -> bool:
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
    try:
        with urllib.request.urlopen(f"{proc.url}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _post(url: str, body: dict[str, Any] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def reset(engines: Sequence[Proc]) -> None:
    """Empty every engine's prefix cache; one tiny request makes it publish the clear."""
    for e in engines:
        _post(f"{e.url}/reset_prefix_cache")
        tiny = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        _post(f"{e.url}/v1/chat/completions", tiny)


def served(engines: Sequence[Proc]) -> list[float]:
    """Each engine's requests so far (vLLM's own counter)."""
    return [metric(e, "vllm:request_success_total") for e in engines]


def start_vllm_router(
    binary: str, engines: Sequence[Proc], feeds: Sequence[tuple[str, str]], policy: str, tmp: Path
) -> Proc:
    args = [
        "--worker-urls",
        *(e.url for e in engines),
        "--policy",
        policy,
        "--log-level",
        "warning",
    ]
    if policy == "kv_aware":
        for e, (ev, rp) in zip(engines, feeds, strict=True):
            args += [
                "--kv-event-source",
                f"{e.url}={ev}",
                "--kv-event-replay-source",
                f"{e.url}={rp}",
            ]
        args += ["--kv-event-model", MODEL]
    args += ["--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port())]
    proc = start(args, tmp, name=f"vllm-router {policy}", port=free_port(), host=LOOPBACK,
                 command=[binary], cwd=tmp)  # fmt: skip
    wait_until(lambda: _serves(proc), f"vllm-router {policy}", 60)
    return proc


def _serves(proc: Proc) -> bool:
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
    try:
        with urllib.request.urlopen(f"{proc.url}/v1/models", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def row(
    label: str, results: Sequence[Streamed | None], before: list[float], after: list[float]
) -> list[str]:
    ok = [r for r in results if r is not None and r.status == 200 and r.done]
    prompt = sum(r.usage[0] for r in ok if r.usage)
    cached = sum(r.usage[1] for r in ok if r.usage)
    firsts = [r.first for r in ok if r.first is not None]
    per = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(per) or 1.0
    return [
        label,
        f"{cached / prompt:.3f}" if prompt else "-",
        f"{percentile(firsts, 50) * 1000:.0f} ms" if firsts else "-",
        f"{percentile(firsts, 99) * 1000:.0f} ms" if firsts else "-",
        str(len(results) - len(ok)),
        " / ".join(f"{n / total:.2f}" for n in per),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--vllm-python", required=True, help="an interpreter with vLLM's CPU build")
    ap.add_argument("--model", type=Path, required=True, help="a model folder (see above)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second")
    ap.add_argument("--num-blocks", type=int, default=0, help="engine cache blocks (0: vLLM's)")
    ap.add_argument("--routers", nargs="+", default=["kvrouter", "vllm-router"])
    ap.add_argument(
        "--vllm-router",
        default=shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or "vllm-router",
    )
    ap.add_argument("--logs", type=Path, help="keep the processes' logs in this folder")
    args = ap.parse_args()
    spec = SyntheticSpec(
        requests=args.requests,
        tenants=12,
        conversations=max(24, args.requests // 8),
        system_prompt_words=300,
        turn_words=(10, 60),
        answer_words=(8, 16),
        rate_per_s=args.rate,
    )
    trace = list(synthetic(spec))
    bodies = [{**dict(r.request_body()), "model": MODEL, "max_tokens": 8} for r in trace]
    times = [r.timestamp for r in trace]
    sessions = [r.session for r in trace]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as d, running([]) as procs:
        tmp = args.logs or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        fleet = [
            start_vllm(args.vllm_python, args.model, core, tmp, args.num_blocks) for core in (0, 1)
        ]
        engines = [p for p, _, _ in fleet]
        feeds = [(ev, rp) for _, ev, rp in fleet]
        procs.extend(engines)
        variants: list[tuple[str, list[str]]] = []
        if "kvrouter" in args.routers:
            variants += [("kvrouter round-robin", ["--policy", "round-robin"]),
                         ("kvrouter kv-aware, approximate", ["--policy", "kv-aware"])]  # fmt: skip
            precise = ["--policy", "kv-aware"]
            for e, (ev, rp) in zip(engines, feeds, strict=True):
                precise += ["--kv-events", f"{e.url}={ev},{rp}"]
            variants.append(("kvrouter kv-aware, precise (events)", precise))
        peers = ["cache_aware", "kv_aware"] if "vllm-router" in args.routers else []
        for label, flags in variants:
            reset(engines)
            cmd = ["serve", *flags, "--host", LOOPBACK]
            for e in engines:
                cmd += ["--engine", e.url]
            router = start_ready(cmd, tmp, ready_path="/ready")
            before = served(engines)
            results = asyncio.run(replay_conversations(router.url, bodies, times, sessions, 1.0))
            rows.append(row(label, results, before, served(engines)))
            router.stop()
            print(markdown_table(HEAD, rows[-1:]), flush=True)
        for policy in peers:
            reset(engines)
            router = start_vllm_router(args.vllm_router, engines, feeds, policy, tmp)
            before = served(engines)
            results = asyncio.run(replay_conversations(router.url, bodies, times, sessions, 1.0))
            rows.append(row(f"vllm-router {policy}", results, before, served(engines)))
            router.stop()
            print(markdown_table(HEAD, rows[-1:]), flush=True)
    print()
    print(markdown_table(HEAD, rows))


if __name__ == "__main__":
    main()
