"""``kvrouter serve`` in front of engines that misbehave: HTML errors naming internal paths,
bytes that are not HTTP, resets, silence and huge answers (tests/gateway/integration/bad_engine.py).

Every client gets an answer in OpenAI's shape that names nothing internal, no request takes an
engine out of the fleet, the gateway logs no stack trace, and a huge answer passes through
without the gateway holding it. Real processes on loopback; every wait is bounded.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.gateway.integration.bad_engine import HUGE_BYTES, MODEL
from tests.support import LOOPBACK, Proc, metric, running, start_kvrouter, status_of

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

CHAT = "/v1/chat/completions"
BAD_ENGINE = (sys.executable, "-m")
CONFIG = """
timeouts: {first_byte_seconds: 1}
health: {interval_seconds: 0.5}
"""


@dataclass
class Fleet:
    engines: list[Proc]
    router: Proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("bad-engines")
    with running([]) as procs:
        for _ in range(2):
            procs.append(
                start_kvrouter(["tests.gateway.integration.bad_engine"], tmp, command=BAD_ENGINE)
            )
        config = tmp / "serve.yaml"
        config.write_text(CONFIG)
        args = ["serve", "--config", str(config), "--host", LOOPBACK]
        for e in procs[:2]:
            args += ["--engine", e.url]
        router = start_kvrouter(args, tmp, ready_path="/ready")
        procs.append(router)
        yield Fleet(procs[:2], router)
        log = router.log()
        assert router.stop() == 0
        assert "Traceback" not in log


def post(url: str, text: str) -> tuple[int, dict[str, str], bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(
        url + CHAT, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read()


def openai_error(body: bytes) -> dict[str, Any]:
    doc = orjson.loads(body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    err: dict[str, Any] = doc["error"]
    return err


@pytest.mark.parametrize(
    ("mark", "status", "code"),
    [
        ("mark:html-500", 502, "upstream_error"),
        ("mark:html-404", 404, "upstream_refused"),
        ("mark:garbage", 502, "upstream_dropped"),
        ("mark:reset", 502, "upstream_dropped"),
        ("mark:silent", 504, "upstream_timeout"),
    ],
)
def test_misbehaving_engine_answer_in_openai_shape_nothing_internal_fleet_kept(
    fleet: Fleet, mark: str, status: int, code: str
) -> None:
    got_status, headers, body = post(fleet.router.url, f"please {mark} now")
    assert got_status == status, body
    err = openai_error(body)
    assert err["code"] == code
    text = body.decode()
    assert "secret" not in text and "10.9.8.7" not in text and LOOPBACK not in text
    assert "Server" not in headers
    # A request that fails on every engine is its own fault: nobody is ejected for it.
    assert status_of(f"{fleet.router.url}/ready") == 200
    assert metric(fleet.router, "kvrouter_backend_healthy") == 2
    ok, _, answer = post(fleet.router.url, "an ordinary question")
    assert ok == 200 and orjson.loads(answer)["choices"][0]["message"]["content"] == "fine"


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def test_huge_answer_passes_through_whole_without_being_held(fleet: Fleet) -> None:
    pid = fleet.router.popen.pid
    before = _kib(pid, "VmRSS")
    status, _, body = post(fleet.router.url, "mark:huge")
    assert status == 200 and len(body) == HUGE_BYTES
    assert orjson.loads(body)["object"] == "chat.completion"
    # Held whole (and joined) the answer would cost the gateway twice its size at its peak.
    growth_mib = (_kib(pid, "VmHWM") - before) / 1024
    assert growth_mib < HUGE_BYTES / (1024 * 1024) / 2, f"grew {growth_mib:.0f} MiB"
