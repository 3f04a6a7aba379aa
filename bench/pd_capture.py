"""What the peers' own prefill/decode proxies send to the engines, written as test fixtures.

Each proxy runs in front of two capturing engines of our own (aiohttp, loopback, free ports),
one where the prefill engine would be and one where the decode engine would be. They record
every request's method, path, headers and raw body, and answer as the engines do: under vLLM's
protocol the prefill engine's one-token answer carries ``kv_transfer_params`` (what vLLM's NIXL
connector returns when a prefill finishes) and the decode engine answers an ordinary completion,
streamed when asked; under SGLang's both answer ordinary completions, and the registration
paths a gateway reads (``/server_info``, ``/model_info``, ``/v1/models``, ``/health``).
OpenAI's Python SDK sends the client's requests through each proxy: chat and completions,
streamed and not, with ``max_completion_tokens``, ``stream_options`` and ``min_tokens``. For
each (protocol, route, stream) the tool writes ``<out>/<protocol>-<route>-<stream>.json``:

- ``client``: the request the client sent, as the SDK serialised it;
- ``prefill`` and ``decode``: what reached each engine, the body as the proxy serialised it
  (key order kept), ``headers`` the protocol's own (``x-request-id``), ``other_headers`` the
  rest in the order sent (all but Host and Content-Length);
- ``prefill_answer`` (vLLM): what the prefill engine answered;
- ``probes``: the other paths the proxy asked the engines for, per role.

Values that vary per request are written as ``<request-id>``, ``<room>`` and ``<host>``.

The proxies (bench.pd_proxies), each run from a scratch folder and given nothing but the two
engines, and where their fixtures go:

- vLLM's NIXL/P2P toy proxy, ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``
  in vllm-project/vllm: ``<out>/vllm-*.json``;
- SGLang's mini load balancer, ``python/sglang/srt/disaggregation/mini_lb.py`` in
  sgl-project/sglang: ``<out>/sglang-*.json`` (SGLang's own reference for the protocol: the
  client's body with the three bootstrap fields added);
- SMG (``smg.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL``):
  ``<out>/smg/sglang-*.json``; with ``--sglang-router-python``, sglang-router's PD mode too:
  ``<out>/sglang-router/sglang-*.json``.

To regenerate the fixtures (the two proxy files saved anywhere, ``--*-commit`` naming the
commits they came from, for the fixtures' ``source``)::

    python -m venv PEERS
    PEERS/bin/pip install 'smg==1.13.*' fastapi httpx uvicorn aiohttp orjson
    python -m bench.pd_capture --peers-python PEERS/bin/python \\
        --vllm-proxy DIR/toy_proxy_server.py --vllm-commit COMMIT \\
        --mini-lb DIR/mini_lb.py --mini-lb-commit COMMIT \\
        [--sglang-router-python SR/bin/python] [--out tests/fixtures/pd]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from aiohttp import web

from bench.pd_proxies import (
    BOOTSTRAP_PORT,
    Peer,
    mini_lb_peer,
    sglang_peer,
    vllm_peer,
    wait_registered,
)
from router.commands.fleet import running, start
from router.hostport import LOOPBACK, free_port

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
STREAMS = {"stream": True, "nostream": False}
MODEL = "sim-model"
CAPTURE_SECONDS = 10.0
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pd"
TRANSPORT_HEADERS = frozenset({"host", "content-length"})
PROTOCOL_HEADERS = frozenset({"x-request-id"})
REQUEST_ID, ROOM, HOST = "<request-id>", "<room>", "<host>"
# What vLLM's NIXL connector answers when a prefill asked for remote decode finishes.
KV_TRANSFER_ANSWER: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [1, 2, 3],
    "remote_engine_id": "prefill-engine-0",
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "tp_size": 1,
}


# The prompts' text: a few hundred tokens, so that a router deciding by cost splits them too.
REPORT = " ".join(f"Section {i}: the harvest rose in region {i}." for i in range(40))


async def send_as_the_sdk(base_url: str, route: str, stream: bool) -> None:
    """The client's request, sent by OpenAI's Python SDK as an application would: chat with
    ``max_completion_tokens`` (the SDK's spelling), completions with ``max_tokens``, both with
    ``min_tokens`` (an engine's extension, through ``extra_body``) and ``temperature`` 0;
    streamed with ``stream_options``, not streamed without ``stream`` (the SDK then leaves it
    out). Streams are read to their end."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="client-key", max_retries=0)
    common: dict[str, Any] = {"model": MODEL, "temperature": 0, "extra_body": {"min_tokens": 2}}
    if stream:
        common |= {"stream": True, "stream_options": {"include_usage": True}}
    async with client:
        if route == "chat":
            messages: list[Any] = [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"{REPORT}\nName its three findings."},
            ]
            answer: Any = await client.chat.completions.create(
                messages=messages, max_completion_tokens=8, **common
            )
        else:
            answer = await client.completions.create(
                prompt=f"{REPORT}\nIts three findings are", max_tokens=8, **common
            )
        if stream:
            async for _ in answer:
                pass


# --- the capturing engines -------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """One request as it reached an engine."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _completion(path: str, body: dict[str, Any]) -> dict[str, Any]:
    chat = path == ROUTES["chat"]
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": "Two"}
    else:
        choice["text"] = " two"
    choice |= {"logprobs": None, "finish_reason": "length"}
    return {
        "id": "cmpl-capture",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": body.get("model", MODEL),
        "choices": [choice],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
    }


def vllm_prefill_answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A vLLM prefill engine's answer to a request asking for remote decode."""
    return {**_completion(path, body), "kv_transfer_params": KV_TRANSFER_ANSWER}


def _chunks(path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chat = path == ROUTES["chat"]
    head = {
        "id": "cmpl-capture",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": body.get("model", MODEL),
    }
    texts = (" two", " three", " five")
    out: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        delta: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
        finish = "length" if i == len(texts) - 1 else None
        out.append({**head, "choices": [{"index": 0, **delta, "finish_reason": finish}]})
    return out


@dataclass
class CaptureEngine:
    """A stand-in engine that records every request and answers as ``role`` does under
    ``protocol``."""

    role: str
    protocol: str
    records: list[Recorded] = field(default_factory=list)
    # Every other path asked for, over the proxy's whole run: what its registration reads.
    probes: set[str] = field(default_factory=set)

    def posts(self) -> list[Recorded]:
        return [r for r in self.records if r.method == "POST"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers)
        self.records.append(Recorded(request.method, request.path_qs, headers, raw))
        path = request.path
        if request.method == "POST" and path in ROUTES.values():
            return await self._generate(request, path, json.loads(raw))
        self.probes.add(f"{request.method} {request.path_qs}")
        if path == "/v1/models":
            card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "capture"}
            return web.json_response({"object": "list", "data": [card]})
        if path == "/server_info":
            info = {"model_path": MODEL, "served_model_name": MODEL, "tp_size": 1, "dp_size": 1}
            return web.json_response({**info, "disaggregation_mode": self.role})
        if path == "/model_info":
            return web.json_response({"model_path": MODEL, "is_generation": True})
        if path == "/health":
            return web.Response()
        return web.json_response({"error": f"{path} is not captured"}, status=404)

    async def _generate(
        self, request: web.Request, path: str, body: dict[str, Any]
    ) -> web.StreamResponse:
        if self.protocol == "vllm" and self.role == "prefill":
            return web.json_response(vllm_prefill_answer(path, body))
        if not body.get("stream"):
            return web.json_response(_completion(path, body))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _chunks(path, body):
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def serving(engine: CaptureEngine) -> AsyncIterator[str]:
    """``engine`` on a free loopback port while the block runs; yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, LOOPBACK, port).start()
        yield f"http://{LOOPBACK}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def bootstrap_listener() -> AsyncIterator[None]:
    """Accept (and close) connections on ``BOOTSTRAP_PORT`` where it is free."""

    def close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    try:
        server = await asyncio.start_server(close, LOOPBACK, BOOTSTRAP_PORT)
    except OSError:
        yield  # taken: SMG then only warns that it could not connect
        return
    async with server:
        yield


async def _one_post(engine: CaptureEngine) -> Recorded:
    deadline = time.monotonic() + CAPTURE_SECONDS
    while not engine.posts():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {engine.role} engine received no request")
        await asyncio.sleep(0.01)
    posts = engine.posts()
    if len(posts) != 1:
        raise RuntimeError(f"the {engine.role} engine received {len(posts)} requests, not 1")
    return posts[0]


async def capture(peer: Peer, tmp: Path) -> dict[str, dict[str, Any]]:
    """The fixtures of ``peer``, by file name."""
    prefill, decode = (
        CaptureEngine("prefill", peer.protocol),
        CaptureEngine("decode", peer.protocol),
    )
    # The client's requests are also sent straight to an engine of their own, which records
    # them as the SDK serialised them.
    client = CaptureEngine("client", "")
    async with (
        serving(prefill) as p_url,
        serving(decode) as d_url,
        serving(client) as c_url,
        bootstrap_listener(),
    ):
        workdir = Path(tempfile.mkdtemp(prefix=f"{peer.protocol}-", dir=tmp))
        argv = peer.argv(p_url, d_url)
        log = workdir / "proxy.log"
        sent = {}
        with running() as procs:
            procs.append(
                start(
                    argv[1:], log, command=argv[:1], host=LOOPBACK, base_env=peer.env, cwd=workdir
                )
            )
            await wait_registered(procs[0], peer.ready_path)
            for route, path in ROUTES.items():
                for stream_name, stream in STREAMS.items():
                    for e in (prefill, decode, client):
                        e.records.clear()
                    await send_as_the_sdk(c_url, route, stream)
                    await send_as_the_sdk(procs[0].url, route, stream)
                    body = json.loads((await _one_post(client)).body)
                    name = f"{peer.protocol}-{route}-{stream_name}.json"
                    sent[name] = (path, body, await _one_post(prefill), await _one_post(decode))
    probes = {e.role: sorted(e.probes) for e in (prefill, decode)}
    return {name: fixture(peer, *one, probes) for name, one in sent.items()}


# --- the fixture -----------------------------------------------------------------------------


def _placeholders(sent: list[Recorded]) -> dict[str, str]:
    """Per-request values in ``sent`` -> their placeholders; each must be the same in every
    request of ``sent`` (one request id, one room), or the capture is not what it claims."""
    found: dict[str, set[str]] = {REQUEST_ID: set(), ROOM: set(), HOST: set()}
    for r in sent:
        found[REQUEST_ID] |= {v for k, v in r.headers if k.lower() == "x-request-id"}
        body = json.loads(r.body)
        if "bootstrap_room" in body:
            found[ROOM].add(json.dumps(body["bootstrap_room"]))
        if isinstance(body.get("bootstrap_host"), str):
            found[HOST].add(body["bootstrap_host"])
    for placeholder, values in found.items():
        if len(values) > 1:
            raise RuntimeError(f"{placeholder} differs between the requests: {sorted(values)}")
    return {value: placeholder for placeholder, values in found.items() for value in values}


def _replace(value: Any, subs: dict[str, str], key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _replace(v, subs, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, subs) for v in value]
    if isinstance(value, str):
        return subs.get(value, value)
    if isinstance(value, int) and key == "bootstrap_room":
        return subs.get(json.dumps(value), value)
    return value


def _request(r: Recorded, subs: dict[str, str]) -> dict[str, Any]:
    named = [(k.lower(), subs.get(v, v)) for k, v in r.headers]
    return {
        "path": r.path,
        "headers": {k: v for k, v in named if k in PROTOCOL_HEADERS},
        "body": _replace(json.loads(r.body), subs),
        "other_headers": {k: v for k, v in named if k not in PROTOCOL_HEADERS | TRANSPORT_HEADERS},
    }


def fixture(
    peer: Peer,
    path: str,
    client: dict[str, Any],
    prefill: Recorded,
    decode: Recorded,
    probes: dict[str, list[str]],
) -> dict[str, Any]:
    """One fixture in the shape tests/fixtures/pd/README.md describes."""
    subs = _placeholders([prefill, decode])
    out: dict[str, Any] = {
        "source": peer.source,
        "protocol": peer.protocol,
        "client": {"path": path, "body": client},
        "prefill": _request(prefill, subs),
    }
    if peer.protocol == "vllm":
        out["prefill_answer"] = vllm_prefill_answer(path, json.loads(prefill.body))
    out["decode"] = _request(decode, subs)
    out["probes"] = probes
    return out


def write(fixtures: dict[str, dict[str, Any]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in sorted(fixtures.items()):
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
        print(folder / name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--peers-python", required=True, help="an interpreter with smg, fastapi, httpx, uvicorn"
    )
    p.add_argument("--vllm-proxy", type=Path, required=True, help="vLLM's toy_proxy_server.py")
    p.add_argument("--vllm-commit", default="", help="the vLLM commit that file is from")
    p.add_argument(
        "--sglang-router-python", help="an interpreter with sglang-router, to capture it too"
    )
    p.add_argument("--mini-lb", type=Path, required=True, help="SGLang's mini_lb.py")
    p.add_argument("--mini-lb-commit", default="", help="the SGLang commit that file is from")
    p.add_argument("--out", type=Path, default=FIXTURES)
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pd-capture-") as tmp:
        scratch = Path(tmp) / "stand-ins"
        peers = [
            vllm_peer(args.peers_python, args.vllm_proxy, args.vllm_commit),
            mini_lb_peer(args.peers_python, args.mini_lb, args.mini_lb_commit, scratch),
            sglang_peer(args.peers_python, "smg", "smg.launch_router", "smg"),
        ]
        if args.sglang_router_python:
            router = ("sglang-router", "sglang_router.launch_router", "sglang-router")
            peers.append(sglang_peer(args.sglang_router_python, *router))
        for peer in peers:
            write(await capture(peer, Path(tmp)), args.out / peer.folder)


def main(argv: list[str] | None = None) -> int:
    # sglang-router also tries HTTP/2 with prior knowledge (its gRPC probe); aiohttp refuses it
    # and would log a traceback for every attempt.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    asyncio.run(_main(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
