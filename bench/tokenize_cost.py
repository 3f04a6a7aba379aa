"""Tokenize cost: the router's local tokenizer against an engine's ``POST /tokenize``, per prompt.

One ``engine-sim --tokenizer`` process answers ``/tokenize`` on loopback. The router's
``Tokenizer`` gets each prompt's ids two ways: by asking that engine (``engine``), or by
computing them on its worker threads (``local``). The prompts are the first ``--prompts``
distinct prompts of a Mooncake trace. Each is tokenized once per way, by a fresh ``Tokenizer``,
so every call misses the cache. The two ways alternate, prompt by prompt, in one process, and
they must give the same ids (checked). The model is a byte-level BPE trained here on those
prompts (``router.enginesim.model_files``), or ``--tokenizer PATH``.

The engine's side is the work vLLM's API server does: the same encode of the same text, plus
the JSON of the ids and the HTTP round trip. The local side is that encode alone. So the ratio
is what the round trip adds, not a property of the tokenizer.

    python -m bench.tokenize_cost [--trace ../shared/data/conversation_trace.jsonl]
        [--prompts 200] [--tokenizer PATH] [--vocab 16000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson

from router.commands.fleet import running, start_ready
from router.core.stats import percentile
from router.core.workload import from_mooncake
from router.enginesim.model_files import write_tokenizer
from router.gateway.openai.request import Inbound, parse
from router.gateway.precise.tokenize import Tokenizer
from router.gateway.upstream.client import HttpUpstream
from router.local_tokenizer import LocalTokenizer

MODEL = "sim-model"


def prompts(path: Path, n: int) -> list[str]:
    """The first ``n`` distinct prompts of the trace."""
    seen: dict[str, None] = {}
    with path.open() as f:
        for i, line in enumerate(f):
            body = from_mooncake(json.loads(line), f"{path}:{i + 1}").request_body()
            seen[str(body["prompt"])] = None
            if len(seen) >= n:
                break
    return list(seen)


async def measure(url: str, local: LocalTokenizer, texts: list[str]) -> dict[str, list[float]]:
    upstream = HttpUpstream(5.0)
    took: dict[str, list[float]] = {"engine": [], "local": []}
    tokens = 0
    try:
        for text in texts:
            req: Inbound = parse(orjson.dumps({"model": MODEL, "prompt": text}), "/v1/completions")
            got = {}
            for way in ("engine", "local"):
                own = local if way == "local" else None
                tok = Tokenizer(5.0, lambda _m: [url], upstream=upstream, local=own)
                t = time.perf_counter()
                ids = await tok(req)
                took[way].append(time.perf_counter() - t)
                await tok.close()
                if ids is None:
                    raise RuntimeError(f"{way} tokenization failed")
                got[way] = list(ids.token_ids)
            if got["engine"] != got["local"]:
                raise RuntimeError("the engine's ids and the local ids differ")
            tokens += len(got["local"])
    finally:
        await upstream.close()
    took["tokens"] = [float(tokens)]
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/conversation_trace.jsonl")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--tokenizer", metavar="PATH", help="a model's tokenizer (default: train one)")
    p.add_argument("--vocab", type=int, default=16_000, help="ids of the trained tokenizer")
    args = p.parse_args(argv)
    texts = prompts(Path(args.trace), args.prompts)
    with tempfile.TemporaryDirectory() as tmp, running([]) as procs:
        model = args.tokenizer or str(write_tokenizer(Path(tmp) / "model", None, texts, args.vocab))
        engine = start_ready(
            ["engine-sim", "--model", MODEL, "--tokenizer", model], Path(tmp), timeout=60
        )
        procs.append(engine)
        took = asyncio.run(measure(engine.url, LocalTokenizer.load(model), texts))
    tokens = took.pop("tokens")[0]
    chars = sum(map(len, texts))
    print(
        f"{len(texts)} prompts of {Path(args.trace).name}: {chars / len(texts):,.0f} characters "
        f"and {tokens / len(texts):,.0f} tokens each on average\n"
    )
    print("| way | p50 ms | p99 ms | mean ms |")
    print("|---|---|---|---|")
    for way, xs in took.items():
        row = [percentile(xs, 50), percentile(xs, 99), sum(xs) / len(xs)]
        print(f"| {way} | " + " | ".join(f"{x * 1000:.1f}" for x in row) + " |")
    e, lo = took["engine"], took["local"]
    print(
        f"\nlocal / engine: p50 {percentile(lo, 50) / percentile(e, 50):.2f}x, "
        f"mean {sum(lo) / sum(e):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
