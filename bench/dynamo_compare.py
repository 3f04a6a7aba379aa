"""kvrouter against NVIDIA Dynamo's KV router, on Dynamo's own simulated engines.

Dynamo's mocker (``python -m dynamo.mocker``) simulates a vLLM-like engine: a paged KV cache
of ``--num-gpu-blocks-override`` blocks of 16 tokens with prefix caching, a scheduler and a
timing model. Two fleets of ``--engines`` mockers, started fresh for each router so every one
begins with empty caches:

- Dynamo: the mockers behind one ``python -m dynamo.frontend --router-mode kv`` (its KV
  router, fed by the mockers' KV events), once with its defaults and once per
  ``--prefill-load-scale`` given (its tuning knob: how much a worker's queued prefill weighs
  against cache overlap);
- kvrouter: each mocker behind its own single-worker frontend (a plain OpenAI engine), the
  frontends behind ``kvrouter serve`` with the kv-aware preset, its index told the engines'
  capacity.

The two paths must cost the same hops for TTFT to compare. kvrouter's has one HTTP proxy more
than Dynamo's frontend alone: each mocker's own frontend. So by default (``--dynamo-hop
kvrouter``) Dynamo's frontend stands behind ``kvrouter serve`` with the round-robin preset
over that one frontend: a pass-through. Both paths are then client -> kvrouter -> Dynamo
frontend -> mockers, the same processes in the same order; what differs is only who decides
(kvrouter's kv-aware policy over four frontends, or Dynamo's KV router behind a kvrouter that
has one choice) and the frontends' count (four single-worker ones against one for all). A
hand-written pass-through would cost what it happens to cost, not what kvrouter's hop costs;
Dynamo's frontend routes only over workers of its own runtime, not HTTP engines, so its KV
router cannot stand where kvrouter does. ``--dynamo-hop none`` runs Dynamo's frontend alone,
as the first measurements did (its TTFT then lacks the hop kvrouter's rows pay). Round-robin
rows through both paths show whether the hops match: their TTFT should agree.

Neither needs etcd or NATS: discovery is Dynamo's file backend, one folder per fleet (or per
engine). The workload is multi-tenant, multi-turn chat (``SyntheticSpec``, ``--tenants``
system prompts), replayed open-loop at its arrival times over ``--speedup``, streamed, each
conversation's turns in order. Caches are sized to ``--cache-share`` of the working set (the
distinct 16-token blocks of every prompt, in the engines' tokens). The engines' tokenizer is a
small BPE made here (router.enginesim.model_files), shared by both fleets.

It prints, per router: the prompt tokens the engines reported cached (hit ratio, from
``usage.prompt_tokens_details.cached_tokens``) against the ideal (one cache holding the whole
working set: every block seen before is a hit), TTFT p50 and p99 at the client, and failures.

Dynamo is not a dependency of kvrouter; install it apart and name its interpreter:

    python -m venv /opt/dynamo && /opt/dynamo/bin/pip install --no-deps ai-dynamo==1.6.1 \\
        ai-dynamo-runtime==1.6.1 && /opt/dynamo/bin/pip install aiohttp certifi msgspec \\
        prometheus-client pyzmq redis tqdm transformers zstandard pydantic uvloop kubernetes
    python -m bench.dynamo_compare --dynamo-python /opt/dynamo/bin/python \\
        [--engines 4] [--tenants 32] [--requests 1500] [--cache-share 0.4] \\
        [--prefill-load-scale 8] [--dynamo-hop kvrouter|none] \\
        [--kvrouter-rows round-robin approximate precise] [--block-chars 512]

(``aisimulate``, which ai-dynamo lists, downloads from elsewhere and only Dynamo's planner
needs it: hence ``--no-deps`` and the list by hand.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from bench.common import Streamed, markdown_table, replay_conversations
from router.commands.fleet import Proc, running, start_ready, wait_until
from router.core.stats import percentile
from router.core.workload import SyntheticSpec, synthetic
from router.enginesim.model_files import CHATML, write_tokenizer
from router.hostport import LOOPBACK, free_port
from router.presets import preset_path

MODEL = "sim-model"
BLOCK_TOKENS = 16
STARTUP_SECONDS = 120.0


def model_folder(folder: Path) -> Path:
    """The engines' model: the BPE tokenizer, its config as Dynamo parses it, a model shape."""
    write_tokenizer(folder)
    # Dynamo reads special tokens as plain strings.
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    shape = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 131072,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "num_hidden_layers": 8,
        "vocab_size": 600,
    }
    (folder / "config.json").write_text(json.dumps(shape))
    return folder


def chatml(messages: Sequence[Mapping[str, Any]]) -> str:
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return f"<s>{turns}<|im_start|>assistant\n"


def working_set_blocks(bodies: Sequence[Mapping[str, Any]], tok: Tokenizer) -> tuple[int, int]:
    """(distinct 16-token prompt blocks, blocks an ideal cache would have served again)."""
    seen: set[int] = set()
    again = 0
    for body in bodies:
        ids = tok.encode(chatml(body["messages"]), add_special_tokens=False).ids
        h = 0
        for i in range(len(ids) // BLOCK_TOKENS):
            h = hash((h, tuple(ids[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS])))
            if h in seen:
                again += 1
            seen.add(h)
    return len(seen), again


@dataclass
class Dynamo:
    python: str
    tmp: Path
    model: Path
    blocks: int
    speedup: float
    procs: list[Proc]

    def _spawn(self, args: Sequence[str], env: Mapping[str, str], name: str, port: int) -> Proc:
        log = self.tmp / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [self.python, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=self.tmp,
            )
        proc = Proc(popen, port, log, name)
        self.procs.append(proc)
        return proc

    def mocker(self, store: Path, name: str, events: tuple[int, int] | None = None) -> Proc:
        """A mocker; with ``events`` (two ports), publishing its KV events as vLLM does."""
        args = [
            "-m", "dynamo.mocker",
            "--model-path", str(self.model), "--model-name", MODEL,
            "--discovery-backend", "file",
            "--num-gpu-blocks-override", str(self.blocks), "--block-size", str(BLOCK_TOKENS),
            "--speedup-ratio", str(self.speedup),
        ]  # fmt: skip
        if events is not None:
            args += ["--zmq-kv-events-ports", str(events[0]), "--zmq-replay-ports", str(events[1])]
        return self._spawn(args, {"DYN_FILE_KV": str(store)}, name, 0)

    def frontend(self, store: Path, name: str, mode: str, flags: Sequence[str] = ()) -> Proc:
        port = free_port()
        args = [
            "-m", "dynamo.frontend", "--router-mode", mode, "--discovery-backend", "file",
            "--http-host", LOOPBACK, "--http-port", str(port), "--kv-cache-block-size",
            str(BLOCK_TOKENS), *flags,
        ]  # fmt: skip
        proc = self._spawn(args, {"DYN_FILE_KV": str(store)}, name, port)
        wait_until(lambda: _serves(proc), f"{name} serving {MODEL}", STARTUP_SECONDS)
        return proc


def _serves(proc: Proc) -> bool:
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
    try:
        with urllib.request.urlopen(f"{proc.url}/v1/models", timeout=2) as r:
            return any(m.get("id") == MODEL for m in json.loads(r.read()).get("data", []))
    except OSError:
        return False


def summary(label: str, results: Sequence[Streamed | None], ideal: float) -> list[str]:
    ok = [r for r in results if r is not None and r.status == 200 and r.done]
    prompt = sum(r.usage[0] for r in ok if r.usage)
    cached = sum(r.usage[1] for r in ok if r.usage)
    firsts = [r.first for r in ok if r.first is not None]
    hit = cached / prompt if prompt else 0.0
    return [
        label,
        f"{hit:.3f}",
        f"{hit / ideal:.3f}" if ideal else "-",
        f"{percentile(firsts, 50) * 1000:.0f} ms",
        f"{percentile(firsts, 99) * 1000:.0f} ms",
        str(len(results) - len(ok)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dynamo-python", required=True, help="an interpreter with ai-dynamo")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second of the trace")
    ap.add_argument("--speedup", type=float, default=1.0, help="replay speed-up")
    ap.add_argument("--mocker-speedup", type=float, default=4.0, help="the mockers' own")
    ap.add_argument("--cache-share", type=float, default=0.4, help="of the working set")
    ap.add_argument("--prefill-load-scale", type=float, nargs="*", default=[8.0])
    ap.add_argument("--logs", type=Path, help="keep the processes' logs in this folder")
    ap.add_argument("--routers", nargs="+", default=["dynamo", "kvrouter"], help="which to run")
    ap.add_argument(
        "--kvrouter-rows",
        nargs="+",
        choices=_KVROUTER_ROWS,
        default=list(_KVROUTER_ROWS),
        help="round-robin; kv-aware on its own predictions (approximate) or the mockers' KV "
        "events (precise)",
    )
    ap.add_argument("--block-chars", type=int, help="kvrouter's block_chars (default the preset's)")
    ap.add_argument(
        "--dynamo-hop",
        choices=["kvrouter", "none"],
        default="kvrouter",
        help="in front of Dynamo's frontend: kvrouter round-robin (the hop kvrouter's fleet "
        "has), or nothing",
    )
    args = ap.parse_args()
    spec = SyntheticSpec(
        requests=args.requests,
        tenants=args.tenants,
        conversations=max(args.tenants * 4, args.requests // 8),
        system_prompt_words=600,
        turn_words=(20, 120),
        answer_words=(20, 80),
        rate_per_s=args.rate,
    )
    trace = list(synthetic(spec))
    bodies = [
        {**dict(r.request_body()), "model": MODEL, "max_tokens": max(1, min(r.output_tokens, 64))}
        for r in trace
    ]
    times = [r.timestamp for r in trace]
    sessions = [r.session for r in trace]
    with tempfile.TemporaryDirectory() as d:
        tmp = args.logs or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        model = model_folder(tmp / "model")
        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        distinct, again = working_set_blocks(bodies, tok)
        total = sum(
            len(tok.encode(chatml(b["messages"]), add_special_tokens=False).ids) // BLOCK_TOKENS
            for b in bodies
        )
        ideal = again / total if total else 0.0
        blocks = max(64, int(args.cache_share * distinct / args.engines))
        chars = sum(len(chatml(b["messages"])) for b in bodies)
        tokens = sum(
            len(tok.encode(chatml(b["messages"]), add_special_tokens=False).ids) for b in bodies
        )
        # kvrouter counts a token as 4 characters: its index capacity in its own tokens.
        router_capacity = int(blocks * BLOCK_TOKENS * (chars / tokens) / 4)
        print(
            f"working set {distinct} blocks of {BLOCK_TOKENS} tokens; {blocks} per engine "
            f"({args.cache_share} of it over {args.engines}); ideal hit ratio {ideal:.3f}"
        )
        rows = []
        configs: list[tuple[str, str, list[str]]] = []
        if "dynamo" in args.routers:
            configs.append(("dynamo round-robin", "round-robin", []))
            configs.append(("dynamo kv (defaults)", "kv", []))
        for s in args.prefill_load_scale if "dynamo" in args.routers else ():
            configs.append((f"dynamo kv --router-prefill-load-scale {s:g}", "kv", [
                "--router-prefill-load-scale", str(s)]))  # fmt: skip
        for n, (label, mode, flags) in enumerate(configs):
            with running([]) as procs:
                dyn = Dynamo(args.dynamo_python, tmp, model, blocks, args.mocker_speedup, procs)
                store = tmp / f"kv-dynamo-{n}"
                mockers = [dyn.mocker(store, f"dynamo-{n}-mocker-{i}") for i in range(args.engines)]
                for m in mockers:  # registered before the frontend reads who serves the model
                    wait_until(partial(_registered, m), f"{m.name} registered", STARTUP_SECONDS)
                front = dyn.frontend(store, f"dynamo-{n}-frontend", mode, flags)
                every = partial(_knows_workers, front, mode, args.engines)
                wait_until(every, "every mocker known", STARTUP_SECONDS)
                target = front.url
                if args.dynamo_hop == "kvrouter":
                    # The hop kvrouter's fleet has: one more HTTP proxy, here kvrouter itself
                    # passing everything to the one frontend (round-robin over one engine).
                    hop = _serve(preset_path("round-robin"), [front.url], tmp)
                    procs.append(hop)
                    target = hop.url
                    label += ", behind kvrouter round-robin"
                results = asyncio.run(
                    replay_conversations(target, bodies, times, sessions, args.speedup)
                )
                rows.append(summary(label, results, ideal))
                print(markdown_table(_HEAD, rows[-1:]), flush=True)
        rows_wanted = args.kvrouter_rows if "kvrouter" in args.routers else []
        for row in rows_wanted:
            preset, index = _KVROUTER_ROWS[row]
            # Precise: the mockers' KV events, and the engines' tokenizer for the token ids.
            with running([]) as procs:
                dyn = Dynamo(args.dynamo_python, tmp, model, blocks, args.mocker_speedup, procs)
                engines, feeds = [], []
                for i in range(args.engines):
                    store = tmp / f"kv-{index}-engine-{i}"
                    ports = (free_port(), free_port()) if index == "precise" else None
                    mocker = dyn.mocker(store, f"{index}-engine-{i}-mocker", ports)
                    wait_until(partial(_registered, mocker), "registered", STARTUP_SECONDS)
                    engines.append(
                        dyn.frontend(store, f"{index}-engine-{i}-frontend", "round-robin")
                    )
                    feeds.append(ports)
                capacity = router_capacity if index == "approximate" else blocks * BLOCK_TOKENS
                policy = tmp / f"{preset}-{index}.yaml"
                text = _policy_with(preset, capacity, args.block_chars)
                policy.write_text(text)
                extra: list[str] = []
                for e, ports in zip(engines, feeds, strict=True):
                    if ports is not None:
                        ev, replay_port = (f"tcp://{LOOPBACK}:{p}" for p in ports)
                        extra += ["--kv-events", f"{e.url}={ev},{replay_port}"]
                if index == "precise":
                    extra += ["--tokenizer", str(model)]
                router = _serve(policy, [e.url for e in engines], tmp, extra)
                procs.append(router)
                results = asyncio.run(
                    replay_conversations(router.url, bodies, times, sessions, args.speedup)
                )
                rows.append(summary(f"kvrouter {preset}, {index}", results, ideal))
                print(markdown_table(_HEAD, rows[-1:]), flush=True)
        print()
        print(markdown_table(_HEAD, rows))


def _serve(policy: Path, engines: Sequence[str], logs: Path, extra: Sequence[str] = ()) -> Proc:
    """``kvrouter serve`` with ``policy`` over ``engines``, ready."""
    cmd = ["serve", "--policy", str(policy), "--host", LOOPBACK]
    for url in engines:
        cmd += ["--engine", url]
    return start_ready([*cmd, *extra], logs, ready_path="/ready")


# Each kvrouter row: its preset and its index.
_KVROUTER_ROWS = {
    "round-robin": ("round-robin", "approximate"),
    "approximate": ("kv-aware", "approximate"),
    "precise": ("kv-aware", "precise"),
}

_HEAD = ["router", "hit ratio", "/ ideal", "TTFT p50", "TTFT p99", "failed"]


def _registered(mocker: Proc) -> bool:
    """Whether the mocker serves its generate endpoint yet (its log says so)."""
    if mocker.popen.poll() is not None:
        raise RuntimeError(f"{mocker.name} exited; see {mocker.log_path}")
    return "Registered endpoint 'dynamo.backend.generate'" in mocker.log_path.read_text(
        errors="replace"
    )


def _knows_workers(front: Proc, mode: str, n: int) -> bool:
    """Whether ``n`` mockers joined the frontend's model (and, in kv mode, its KV router):
    its log says so."""
    log = re.sub(r"\x1b\[[0-9;]*m", "", front.log_path.read_text(errors="replace"))  # colours
    members = max((int(m) for m in re.findall(r"members=(\d+)", log)), default=0)
    return members >= n and (mode != "kv" or log.count("Adding worker") >= n)


def _policy_with(preset: str, tokens: int, block_chars: int | None) -> str:
    """The preset with its index told the engines' capacity, as an operator would set it, and
    ``block_chars`` when given."""
    text = preset_path(preset).read_text()
    text = text.replace("engine_capacity_tokens: 1000000", f"engine_capacity_tokens: {tokens}")
    if block_chars is not None:
        text = text.replace("\nblock_chars: 512\n", f"\nblock_chars: {block_chars}\n")
    return text


if __name__ == "__main__":
    main()
