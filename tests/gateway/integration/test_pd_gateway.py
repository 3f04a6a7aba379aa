"""Prefill/decode disaggregation end to end: ``kvrouter serve`` in front of real prefill and
decode engine processes on loopback, called with the official openai client, under both
protocols, streamed and not.

The engines (tests/gateway/disagg/pd_engine.py) check what they receive and refuse what the
real ones would not take; their decode side depends on the prefill side for real: vLLM's
decode engine pulls the blocks the prefill engine handed out under the request's id, from
the address in ``kv_transfer_params`` (so the params must arrive exactly as answered), and
SGLang's decode engine waits in its room at the prefill engine's bootstrap server (so both
must get the same room). Each fleet: two prefill engines, two decode engines (busy, so a
split pays), the router. Failures are injected per engine (``POST /fault``); which engines a
request will meet is read first from ``/debug/route`` (the state it decides on does not
change in between).
"""

from __future__ import annotations

import itertools
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.disagg.pd_engine import MODEL
from tests.gateway.integration import ADMIN, ADMIN_ENV
from tests.gateway.integration.test_gateway import assert_inflight_zero
from tests.support import (
    LOOPBACK,
    Proc,
    ametric,
    eventually,
    free_port,
    http_json,
    readiness,
    running,
    start_kvrouter,
    wait_until,
)

pytestmark = pytest.mark.integration

ENGINE = (sys.executable, "-m", "tests.gateway.disagg.pd_engine")
CONFIG = """
engines:
  static:
{entries}
disaggregation: {{protocol: {protocol}, stay_below_tokens: 16}}
timeouts: {{first_byte_seconds: 20, idle_stream_seconds: 20}}
health: {{interval_seconds: 0.5}}
engine_metrics: {{interval_seconds: 0.2}}
"""
PROMPTS = itertools.count()


@dataclass
class Fleet:
    protocol: str
    prefill: list[Proc]
    decode: list[Proc]
    router: Proc

    @property
    def engines(self) -> list[Proc]:
        return [*self.prefill, *self.decode]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    protocol: str = request.param
    tmp = tmp_path_factory.mktemp(f"pd-{protocol}")
    with running([]) as procs:
        entries = []
        prefill: list[Proc] = []
        decode: list[Proc] = []
        for role in ("prefill", "prefill", "decode", "decode"):
            args = ["--protocol", protocol, "--role", role]
            port = free_port() if role == "prefill" else 0
            if port:
                args += ["--bootstrap-port", str(port)]
            if role == "decode":
                args += ["--running", "4"]
            engine = start_kvrouter(args, tmp, command=ENGINE)
            procs.append(engine)
            (prefill if role == "prefill" else decode).append(engine)
            extra = f", bootstrap_port: {port}" if port else ""
            # The prefill entries leave their kind out: under SGLang's protocol the gateway
            # aborts them as SGLang servers all the same.
            kind = ", kind: sglang" if protocol == "sglang" and role == "decode" else ""
            entries.append(f'    - {{url: "{engine.url}", role: {role}{kind}{extra}}}')
        config = tmp / "serve.yaml"
        config.write_text(CONFIG.format(entries="\n".join(entries), protocol=protocol))
        router = start_kvrouter(
            ["serve", "--config", str(config), "--host", LOOPBACK], tmp, env=ADMIN_ENV
        )
        procs.append(router)
        wait_until(lambda: readiness(router)["healthy_backends"] == 4, "every engine healthy")
        fleet = Fleet(protocol, prefill, decode, router)
        wait_until(lambda: route(fleet, prompt())["path"] == "split", "the decode engines busy")
        yield fleet
        log = router.log()
        assert router.stop() == 0
        assert "Traceback" not in log


@pytest.fixture(autouse=True)
def fresh(fleet: Fleet) -> Iterator[None]:
    for e in fleet.engines:
        post(e, "/reset", {})
    yield
    assert_inflight_zero(fleet.router)


def post(engine: Proc, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        engine.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def received(engine: Proc) -> dict[str, Any]:
    got: dict[str, Any] = http_json(f"{engine.url}/received")
    return got


def requests_of(engine: Proc) -> list[dict[str, Any]]:
    reqs: list[dict[str, Any]] = received(engine)["requests"]
    return reqs


def prompt() -> str:
    n = next(PROMPTS)
    return f"Document {n}. " + " ".join(
        f"line {i} of document {n} says nothing new." for i in range(40)
    )


def messages(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def route(fleet: Fleet, text: str) -> dict[str, Any]:
    """The disaggregated decision the router would make for ``text`` now."""
    body = {"model": MODEL, "messages": messages(text)}
    req = urllib.request.Request(
        f"{fleet.router.url}/debug/route",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json", **ADMIN},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        split: dict[str, Any] = orjson.loads(r.read())["disaggregation"]
    return split


def by_url(fleet: Fleet, url: str) -> Proc:
    return next(e for e in fleet.engines if e.url == url)


PRIVATE = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room")


def assert_split_wire(fleet: Fleet, prefill: Proc, decode: Proc, stream: bool) -> None:
    """What the two engines got is the protocol's split of one client request."""
    (pre,), (dec,) = requests_of(prefill), requests_of(decode)
    if fleet.protocol == "vllm":
        assert pre["body"]["kv_transfer_params"]["do_remote_decode"] is True
        assert pre["body"]["stream"] is False and pre["body"]["max_tokens"] == 1
        assert dec["body"]["kv_transfer_params"]["remote_engine_id"]
        assert dec["body"].get("stream", False) is stream
        assert pre["headers"]["x-request-id"] == dec["headers"]["x-request-id"]
    else:
        assert {k: v for k, v in pre["body"].items() if k != "rid"} == {
            k: v for k, v in dec["body"].items() if k != "rid"
        }
        host = prefill.url.split("//")[1].rsplit(":", 1)[0]
        assert dec["body"]["bootstrap_host"] == host
        assert isinstance(dec["body"]["bootstrap_port"], int)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_client_through_a_split_fleet(fleet: Fleet, stream: bool) -> None:
    client = fleet.client()
    text = prompt()
    split = route(fleet, text)
    assert split["path"] == "split"
    prefill, decode = by_url(fleet, split["prefill_engine"]), by_url(fleet, split["engine"])
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages(text), max_tokens=4, stream=True
            )
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(not set(PRIVATE) & set(c.model_extra or {}) for c in chunks)
    else:
        answer = client.chat.completions.create(model=MODEL, messages=messages(text), max_tokens=4)
        content = answer.choices[0].message.content or ""
        assert not set(PRIVATE) & set(answer.model_extra or {})
    assert content == " t0 t1 t2 t3"
    assert_split_wire(fleet, prefill, decode, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_through_a_split_fleet(fleet: Fleet, stream: bool) -> None:
    client = fleet.client()
    text = prompt()
    before = requests_count(fleet)
    if stream:
        parts = client.completions.create(model=MODEL, prompt=text, max_tokens=3, stream=True)
        content = "".join(c.choices[0].text for c in parts if c.choices)
    else:
        content = client.completions.create(model=MODEL, prompt=text, max_tokens=3).choices[0].text
    assert content == " t0 t1 t2"
    assert requests_count(fleet) == before + 2  # one prefill, one decode


def requests_count(fleet: Fleet) -> int:
    return sum(len(requests_of(e)) for e in fleet.engines)


def test_a_failed_prefill_costs_the_client_nothing(fleet: Fleet) -> None:
    text = prompt()
    split = route(fleet, text)
    prefill, decode = by_url(fleet, split["prefill_engine"]), by_url(fleet, split["engine"])
    post(prefill, "/fault", {"status": 500})
    answer = fleet.client().chat.completions.create(
        model=MODEL, messages=messages(text), max_tokens=2
    )
    assert answer.choices[0].message.content == " t0 t1"
    got = requests_of(decode)
    if fleet.protocol == "vllm":  # run whole on the decode engine
        (dec,) = got
        assert "kv_transfer_params" not in dec["body"]
    else:  # the pair redone with the other prefill engine, in a new room
        other = next(p for p in fleet.prefill if p is not prefill)
        assert len(requests_of(other)) == 1
        rooms = {r["body"]["bootstrap_room"] for r in got}
        assert len(got) == 2 and len(rooms) == 2


def test_a_failed_decode_is_retried_on_the_other(fleet: Fleet) -> None:
    text = prompt()
    split = route(fleet, text)
    decode = by_url(fleet, split["engine"])
    other = next(d for d in fleet.decode if d is not decode)
    post(decode, "/fault", {"status": 503})
    answer = fleet.client().chat.completions.create(
        model=MODEL, messages=messages(text), max_tokens=2
    )
    assert answer.choices[0].message.content == " t0 t1"
    (failed,), (retried,) = requests_of(decode), requests_of(other)
    if fleet.protocol == "vllm":
        # The same params: the retry pulled the blocks the prefill engine still held.
        assert failed["body"]["kv_transfer_params"] == retried["body"]["kv_transfer_params"]
        assert sum(len(requests_of(p)) for p in fleet.prefill) == 1
    else:
        assert failed["body"]["bootstrap_room"] != retried["body"]["bootstrap_room"]


async def test_a_client_leaving_mid_stream_cancels_the_decode(fleet: Fleet) -> None:
    text = prompt()
    split = route(fleet, text)
    decode = by_url(fleet, split["engine"])
    post(decode, "/fault", {"token_seconds": 1.0})
    body = {"model": MODEL, "messages": messages(text), "max_tokens": 6, "stream": True}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{fleet.router.url}/v1/chat/completions", json=body)
        assert resp.status == 200
        assert await resp.content.readany()
        resp.close()
    got = await eventually(lambda: received(decode)["cut"], timeout=15)
    assert len(got) == 1
    if fleet.protocol == "sglang":
        rid = requests_of(decode)[0]["body"]["rid"]
        assert (await eventually(lambda: received(decode)["aborted"])) == [rid]


async def test_a_client_leaving_during_the_prefill_cancels_both(fleet: Fleet) -> None:
    text = prompt()
    split = route(fleet, text)
    prefill, decode = by_url(fleet, split["prefill_engine"]), by_url(fleet, split["engine"])
    post(prefill, "/fault", {"hang": True})
    body = {"model": MODEL, "messages": messages(text), "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        with pytest.raises(TimeoutError):
            await http.post(
                f"{fleet.router.url}/v1/chat/completions",
                json=body,
                timeout=aiohttp.ClientTimeout(total=1.0),
            )
    await eventually(lambda: received(prefill)["cut"], timeout=15)
    if fleet.protocol == "vllm":
        assert requests_of(decode) == []  # never asked
    else:  # both sides of the pair were under way: both aborted
        for e in (prefill, decode):
            rid = requests_of(e)[0]["body"]["rid"]
            assert (await eventually(aborted_at(e), timeout=15)) == [rid]
        await eventually(lambda: received(decode)["cut"], timeout=15)


def aborted_at(engine: Proc) -> Callable[[], list[str]]:
    def aborted() -> list[str]:
        rids: list[str] = received(engine)["aborted"]
        return rids

    return aborted


async def test_metrics_count_the_split_and_the_load_per_role(fleet: Fleet) -> None:
    splits = await ametric(
        fleet.router, "kvrouter_disagg_decisions_total", path="split", why=why(fleet)
    )
    fleet.client().chat.completions.create(model=MODEL, messages=messages(prompt()), max_tokens=1)
    after = await ametric(
        fleet.router, "kvrouter_disagg_decisions_total", path="split", why=why(fleet)
    )
    assert after == splits + 1
    assert await ametric(fleet.router, "kvrouter_disagg_transfer_bytes_total") > 0
    for role in ("prefill", "decode", "both"):
        assert await ametric(fleet.router, "kvrouter_role_inflight_requests", role=role) == 0


def why(fleet: Fleet) -> str:
    return "split-cheaper" if fleet.protocol == "vllm" else "protocol-splits"
