"""What reading sessions, aliases and abort ids costs per request, against parsing the body.

In one process, on one agent-sized chat body (a system prompt, tools and a 20-turn history,
about 30 KB), it times what the gateway now does per request besides parsing: naming the
session (operator headers only; with the agents' ids, none present; Claude Code's
``metadata.user_id`` object), rewriting the model (no aliases; 100 aliases and 10 patterns that
do not match; an alias that matches, which re-serialises the body) and tagging an attempt for an
SGLang engine with its rid. Every case runs in each of ``--rounds`` rounds, in turn, so the
machine's noise falls on all of them alike; the table gives each case's median per call and
its ratio to the body's parse (``router.gateway.openai.request.parse``, what every request
pays already).

    python -m bench.request_reading [--rounds 15] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from router.core.scorers.session_affinity import Params, session_of
from router.gateway.config.settings import load_config_text
from router.gateway.openai.request import LARGE_BODY_BYTES, parse
from router.gateway.upstream.abort import Aborts
from router.gateway.upstream.client import HttpUpstream

ROUTE = "/v1/chat/completions"
ENGINE = "http://sglang:30000"
CLAUDE_USER = '{"device_id":"5b1e","account_uuid":"","session_id":"54c1eb09-bc4c-4d2f-98eb"}'


def agent_body(model: str = "claude-sonnet") -> bytes:
    system = " ".join(f"rule {i}: keep edits small and run the tests" for i in range(80))
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "x " * 40}}
        for i in range(8)
    ]
    history = []
    for turn in range(20):
        history.append({"role": "user", "content": f"turn {turn}: fix the failing test " * 8})
        history.append({"role": "assistant", "content": f"edited file {turn}.py " * 12})
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "system", "content": system}, *history],
            "tools": tools,
            "stream": True,
            "metadata": {"user_id": CLAUDE_USER},
        }
    )


def timed(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn``, over ``calls`` calls."""
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    raw = agent_body()
    inbound = parse(raw, ROUTE)
    # The light body an exchange keeps: scalars, and the nested ids sessions read.
    plain = {k: v for k, v in inbound.body.items() if not isinstance(v, dict | list)}
    plain["metadata"] = {"user_id": "user-7"}
    headers = {"content-type": "application/json", "authorization": "Bearer k"}
    many = ", ".join(f"alias-{i}: served-{i}" for i in range(100))
    globs = ", ".join(f"{{match: 'family-{i}-*', model: served-{i}}}" for i in range(10))
    none = load_config_text("", "c").models
    missing = load_config_text(f"models: {{aliases: {{{many}}}, patterns: [{globs}]}}", "c").models
    hit = load_config_text("models: {aliases: {claude-sonnet: served-0}}", "c").models
    aborts = Aborts(HttpUpstream(1.0), lambda _e: "sglang")  # tagging opens no connection
    assert len(raw) < LARGE_BODY_BYTES  # parsed on the event loop, as measured here

    cases: dict[str, Callable[[], object]] = {
        "parse the body (the baseline)": lambda: parse(raw, ROUTE),
        "session: operator header and user only": lambda: session_of(
            Params(agent_ids=False), headers, plain
        ),
        "session: agents' ids, none present": lambda: session_of(Params(), headers, plain),
        "session: Claude Code metadata.user_id": lambda: session_of(
            Params(), headers, inbound.body
        ),
        "aliases: none configured": lambda: none.rewrite(inbound, raw),
        "aliases: 100 + 10 patterns, no match": lambda: missing.rewrite(inbound, raw),
        "aliases: matched (body re-serialised)": lambda: hit.rewrite(inbound, raw),
        "abort: rid put in an SGLang body": lambda: aborts.tag(ENGINE, ROUTE, raw, "req-1"),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(timed(fn, args.calls))
    base = statistics.median(times["parse the body (the baseline)"])
    print(f"body: {len(raw)} bytes; {args.rounds} rounds of {args.calls} calls per case\n")
    print("| per request | median | vs parse |")
    print("|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m * 1e6:.2f} us | {m / base:.3f}x |")


if __name__ == "__main__":
    main()
