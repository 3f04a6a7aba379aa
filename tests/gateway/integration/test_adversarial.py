"""``kvrouter serve`` attacked as a fresh install would be, on loopback: every input bounded,
nothing internal leaks.

Real ``engine-sim --fast`` engines behind a real gateway; raw sockets where a client library
would refuse to send the malformed bytes. Each attack is bounded in count and time, and what is
checked is the gateway's answer (its status, OpenAI's error shape, no ``Server`` banner, no
stack trace in its log), never how fast it came. Memory is read from /proc/PID/status.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import re
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.presets import preset_path
from tests.chart.support import ROUTER_METRICS
from tests.support import (
    LOOPBACK,
    Proc,
    metric,
    metrics_text,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

MODEL = "sim-model"
TOKEN = "adversarial-admin-token"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MIB = 1024 * 1024
BODY_LIMIT = 4 * MIB
HEADER_TIMEOUT = 1.0
# How long a test waits for the gateway to act; a bound on the test, not a claim on speed.
PATIENCE = 20.0

CONFIG = """
policy: {policy}
policy_reload: {{enabled: false}}
health: {{interval_seconds: 0.5, timeout_seconds: 2}}
limits: {{max_body_bytes: {body_limit}, max_connections: {max_connections},
         header_timeout_seconds: {header_timeout}, keepalive_timeout_seconds: 30}}
"""


@dataclass
class Fleet:
    engines: list[Proc]
    router: Proc
    tmp: Path

    def start_router(self, procs: list[Proc], name: str, **limits: Any) -> Proc:
        """Another gateway in front of the same engines, with its own limits."""
        settings = {
            "body_limit": BODY_LIMIT,
            "max_connections": 64,
            "header_timeout": HEADER_TIMEOUT,
            **limits,
        }
        policy = self.tmp / "policy.yaml"
        if not policy.exists():
            shutil.copyfile(preset_path("kv-aware"), policy)
        config = self.tmp / f"{name}.yaml"
        config.write_text(CONFIG.format(policy=policy, **settings))
        args = ["serve", "--config", str(config), "--host", LOOPBACK]
        for e in self.engines:
            args += ["--backend", e.url]
        router = start_kvrouter(
            args, self.tmp, env={"KVROUTER_ADMIN_TOKEN": TOKEN}, ready_path="/ready"
        )
        procs.append(router)
        return router


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("adversarial")
    with running([]) as procs:
        engines = [start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2)]
        procs.extend(engines)
        f = Fleet(engines, engines[0], tmp)
        f.router = f.start_router(procs, "serve")
        yield f
        log = f.router.log()
        assert f.router.stop() == 0
        assert "Traceback" not in log


# -- raw HTTP ------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        """The OpenAI error object of the body (asserting the shape)."""
        doc = json.loads(self.body)
        assert set(doc) == {"error"}
        err: dict[str, Any] = doc["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert isinstance(err["message"], str) and err["message"]
        return err


def parse_answer(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(status, headers, body)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (bounded by PATIENCE)."""
    sock.settimeout(PATIENCE)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def exchange_raw(proc: Proc, data: bytes) -> Answer:
    """Send ``data`` on a fresh connection; the answer, read until the gateway closes."""
    with socket.create_connection((LOOPBACK, proc.port), timeout=PATIENCE) as sock:
        sock.sendall(data)
        return parse_answer(read_until_closed(sock))


def request(
    proc: Proc,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """An HTTP request with urllib (well-formed); the answer, whatever its status."""
    req = urllib.request.Request(proc.url + path, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=PATIENCE) as r:
            return Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        with e:
            return Answer(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
        **extra,
    }


JSON = {"Content-Type": "application/json"}


# -- slowloris and floods ------------------------------------------------------------------


def test_slowloris_trickled_headers_closed_after_header_timeout(fleet: Fleet) -> None:
    before = metric(fleet.router, "kvrouter_client_connections_rejected_total")
    with socket.create_connection((LOOPBACK, fleet.router.port), timeout=PATIENCE) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.2)
        answer = b""
        # One header line every 0.2 s, for up to 100 lines (20 s): far past the 1 s deadline.
        for i in range(100):
            try:
                sock.sendall(f"X-Slow-{i}: y\r\n".encode())
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break  # closed under us: what was sent before it is read below
            if answer:
                break
        else:
            pytest.fail("the gateway kept a connection trickling headers for 20 s")
        with contextlib.suppress(OSError):
            answer += read_until_closed(sock)
    got = parse_answer(answer)
    assert got.status == 408
    assert got.error()["code"] == "request_header_timeout"
    assert "server" not in got.headers
    after = metric(fleet.router, "kvrouter_client_connections_rejected_total")
    assert after - before >= 1


def test_silent_connection_closed_after_header_timeout(fleet: Fleet) -> None:
    with socket.create_connection((LOOPBACK, fleet.router.port), timeout=PATIENCE) as sock:
        got = parse_answer(read_until_closed(sock))
    assert got.status == 408 and got.error()["type"] == "invalid_request_error"


def test_connection_flood_beyond_cap_refused_gateway_still_answers(
    fleet: Fleet, procs: list[Proc]
) -> None:
    cap, extra = 16, 24
    # A long header deadline: the idle connections stay open for as long as the test needs.
    router = fleet.start_router(procs, "flood", max_connections=cap, header_timeout=60)
    held: list[socket.socket] = []
    try:
        for _ in range(cap + extra):
            held.append(socket.create_connection((LOOPBACK, router.port), timeout=PATIENCE))
        refused = [parse_answer(read_until_closed(s)) for s in held[cap:]]
        assert [a.status for a in refused] == [503] * extra
        assert all(a.error()["code"] == "too_many_connections" for a in refused)
        assert all("retry-after" in a.headers and "server" not in a.headers for a in refused)
        # A real client is answered at once while the flood lasts (refused, not left hanging)...
        busy = request(router, "/health")
        assert busy.status == 503 and busy.error()["code"] == "too_many_connections"
        # ... and served as soon as connections are free again.
        for s in held[:cap]:
            s.close()
        wait_until(lambda: request(router, "/health").status == 200, "a free connection")
        # At least the refusals seen above (a poll may race the server seeing a close).
        refused_total = metric(
            router, "kvrouter_client_connections_rejected_total", reason="max_connections"
        )
        assert refused_total >= extra + 1
        assert metric(router, "kvrouter_client_connections") >= 1  # the scrape's own
    finally:
        for s in held:
            s.close()


# -- malformed HTTP: OpenAI's shape, one log line, no stack trace ----------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Content-Length: 6\r\n\r\nhello!",
    ],
    ids=["request-line", "header", "long-line", "chunk-size", "two-lengths"],
)
def test_malformed_http_400_openai_shape_no_traceback(fleet: Fleet, data: bytes) -> None:
    got = exchange_raw(fleet.router, data)
    assert got.status == 400
    err = got.error()
    assert err["type"] == "invalid_request_error" and err["code"] == "bad_http_request"
    assert got.headers["content-type"] == "application/json"
    assert "server" not in got.headers
    assert "Traceback" not in fleet.router.log()
    assert "malformed request from 127.0.0.1" in fleet.router.log()


http_pieces = st.sampled_from(
    [b"GET ", b"POST ", b"G\x00T ", b"PRI * HTTP/2.0\r\n", b"/health", b"/v1/completions",
     b"/%ff", b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", b" HTTP/9.9\r\n", b"Host: x\r\n",
     b"Content-Length: 3\r\n", b"Content-Length: -1\r\n", b"Transfer-Encoding: chunked\r\n",
     b"Content-Encoding: gzip\r\n", b"Bad Header\r\n", b"X: \xff\xfe\r\n", b"\r\n",
     b"\n", b"3\r\nabc\r\n", b"0\r\n\r\n", b"ZZ\r\n", b"{}", b"\x16\x03\x01"]
)  # fmt: skip
http_garbage = st.lists(http_pieces | st.binary(max_size=20), max_size=12).map(b"".join)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=http_garbage)
def test_fuzz_http_bytes_answered_in_openai_shape_without_banner(fleet: Fleet, data: bytes) -> None:
    with socket.create_connection((LOOPBACK, fleet.router.port), timeout=PATIENCE) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # nothing more: the gateway answers, then closes
        try:
            got = read_until_closed(sock)
        except ConnectionResetError:
            return  # closed on us with nothing to say: nothing leaked either
    if not got:
        return
    responses = [r for r in re.split(rb"(?=HTTP/1\.[01] \d{3} )", got) if r]
    assert responses and responses[0].startswith(b"HTTP/1.")
    for one in responses:
        answer = parse_answer(one)
        assert "server" not in answer.headers
        if answer.status >= 400:
            assert answer.headers["content-type"].startswith("application/json")
            answer.error()
    assert "Traceback" not in fleet.router.log()


# -- bodies ----------------------------------------------------------------------------------


NEST = "@nested@"


def with_nesting(body: Any, depth: int = 1000) -> bytes:
    """``body`` as JSON, with ``NEST`` replaced by arrays nested ``depth`` deep."""
    return json.dumps(body).replace(f'"{NEST}"', "[" * depth + "]" * depth).encode()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(tools=NEST), "tools"),
        (
            chat(messages=[{"role": "assistant", "content": None, "tool_calls": NEST}]),
            "messages[0].tool_calls",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "audio", "x": NEST}]}]),
            "messages[0].content[0]",
        ),
    ],
    ids=["tools", "tool_calls", "content-part"],
)
def test_deeply_nested_json_400_names_field(fleet: Fleet, body: Any, param: str) -> None:
    got = request(fleet.router, CHAT, with_nesting(body), JSON)
    assert got.status == 400
    err = got.error()
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert "Traceback" not in fleet.router.log()


def test_gzip_body_is_forwarded_decoded_200(fleet: Fleet) -> None:
    body = gzip.compress(json.dumps(chat()).encode())
    got = request(fleet.router, CHAT, body, {**JSON, "Content-Encoding": "gzip"})
    assert got.status == 200, got.body
    assert json.loads(got.body)["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "value",
    [b"Bearer \xff\xfe\xfd", b"Bearer \xc3\x28", b"\xff Bearer", b"Bearer " + TOKEN.encode()[:-1]],
    ids=["bad-utf8", "bad-utf8-2", "bad-scheme", "wrong-token"],
)
def test_admin_authorization_not_utf8_401(fleet: Fleet, value: bytes) -> None:
    data = b"GET /debug/backends HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    got = exchange_raw(fleet.router, data + b"Authorization: " + value + b"\r\n\r\n")
    assert got.status == 401
    assert got.error()["type"] == "authentication_error"
    ok = request(fleet.router, "/debug/backends", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status == 200


# -- no version banner, anywhere ---------------------------------------------------------------


def test_no_server_header_on_any_response(fleet: Fleet) -> None:
    r = fleet.router
    answers = [
        request(r, "/health"),
        request(r, "/ready"),
        request(r, "/metrics"),
        request(r, "/v1/models"),
        request(r, "/nowhere"),
        request(r, CHAT, b"{not json", JSON),
        request(r, CHAT, json.dumps(chat()).encode(), JSON),
        request(r, CHAT, json.dumps(chat(stream=True)).encode(), JSON),
        request(r, CHAT, json.dumps(chat(model="unknown")).encode(), JSON),
        request(r, CHAT, b"x" * (BODY_LIMIT + 1), JSON),
        exchange_raw(r, b"BAD\r\n\r\n"),
    ]
    statuses = sorted({a.status for a in answers})
    assert statuses == [200, 400, 404, 413]
    assert any(a.headers.get("content-type", "").startswith("text/event-stream") for a in answers)
    for a in answers:
        assert "server" not in a.headers, (a.status, a.headers)


def test_metrics_client_connections_are_in_the_contract(fleet: Fleet) -> None:
    text = metrics_text(fleet.router)
    for name, kind in (
        ("kvrouter_client_connections", "gauge"),
        ("kvrouter_client_connections_rejected_total", "counter"),
    ):
        assert ROUTER_METRICS[name] == kind
        assert f"\n{name}" in text or text.startswith(name)


# -- memory under large inputs ------------------------------------------------------------------


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def token_body(limit: int) -> bytes:
    """Completions with token ids as the prompt, just under ``limit`` bytes."""
    n = limit // 6
    while True:
        ids = [1000 + (i * 7919) % 149_000 for i in range(n)]
        body = orjson.dumps({"model": MODEL, "prompt": ids, "max_tokens": 1})
        if len(body) <= limit:
            return body
        n -= (len(body) - limit) // 7 + 1


def messages_body(limit: int) -> bytes:
    """A chat body of one-word messages, just under ``limit`` bytes."""
    n = (limit - 200) // len(b'{"role":"user","content":"w0000000"},')
    messages = [{"role": "user", "content": f"w{i:07d}"} for i in range(n)]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 1})


async def send_at_once(url: str, body: bytes, n: int) -> list[int]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one() -> int:
            async with http.post(url, data=io.BytesIO(body), headers=JSON) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.parametrize(
    ("kind", "make", "path"),
    [("tokens", token_body, COMPLETIONS), ("messages", messages_body, CHAT)],
    ids=["token-ids", "many-messages"],
)
def test_memory_bounded_by_body_limit_under_concurrent_large_bodies(
    fleet: Fleet, procs: list[Proc], kind: str, make: Any, path: str
) -> None:
    # Each in-flight request may hold a few copies of its body (read, packed prompt, sent);
    # parses, which cost several times a body, run one at a time. Before the bound, a
    # 4 MiB token-id body cost the gateway about 10 times its size, and one of many small
    # messages about 12 times (bench/RESULTS.md, "Memory under large inputs").
    n = 8
    router = fleet.start_router(procs, f"memory-{kind}")
    pid = router.popen.pid
    body = make(BODY_LIMIT)
    assert BODY_LIMIT - 64 * 1024 < len(body) <= BODY_LIMIT
    warm = asyncio.run(send_at_once(router.url + path, make(64 * 1024), 2))
    assert warm == [200, 200]
    baseline = rss_kib(pid, "VmRSS")
    statuses = asyncio.run(send_at_once(router.url + path, body, n))
    assert statuses == [200] * n
    growth = (rss_kib(pid, "VmHWM") - baseline) * 1024
    bound = n * 6 * BODY_LIMIT
    assert growth < bound, f"{kind}: peak {growth / MIB:.0f} MiB above baseline"
    assert "Traceback" not in router.log()
