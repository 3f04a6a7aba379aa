"""Aborts: which attempts carry a rid, the bytes they send, and the bounded aborts posted."""

from __future__ import annotations

import orjson
import pytest

from router.gateway.config.engines import DnsEngines, EngineSources
from router.gateway.upstream import abort
from router.gateway.upstream.abort import Aborts
from tests.fakes import FakeEngine, FakeUpstream
from tests.support import eventually

SG, VL = "http://sg:8000", "http://vl:8000"
CHAT = "/v1/chat/completions"


def kinds(url: str) -> str:
    return "sglang" if url == SG else "vllm"


def aborts(up: FakeUpstream | None = None, counted: list[str] | None = None) -> Aborts:
    up = up or FakeUpstream(FakeEngine(SG), FakeEngine(VL))
    return Aborts(up, kinds, (counted if counted is not None else []).append)


@pytest.mark.parametrize(
    "raw",
    [b'{"model":"m","messages":[]}', b'  {"model": "m", "prompt": "x"}', b'{\n "model":"m"}'],
    ids=["compact", "leading-space", "newline"],
)
def test_tag_puts_a_unique_rid_in_front_and_keeps_the_rest(raw: bytes) -> None:
    a = aborts()
    body, rid = a.tag(SG, CHAT, raw, "req-1")
    _, rid2 = a.tag(SG, CHAT, raw, "req-1")
    assert rid is not None and rid.startswith("req-1-") and rid != rid2
    parsed = orjson.loads(body)
    assert parsed.pop("rid") == rid
    assert parsed == orjson.loads(raw)


@pytest.mark.parametrize(
    ("engine", "route", "raw"),
    [
        (VL, CHAT, b'{"model":"m"}'),
        (SG, "/v1/embeddings", b'{"model":"m"}'),
        (SG, CHAT, b'{"model":"m","rid":"mine"}'),
        (SG, CHAT, b'{"model":"m","messages":[{"role":"user","content":"rid"}]}'),
    ],
    ids=["vllm-engine", "embeddings", "client-rid", "rid-in-the-text"],
)
def test_tag_leaves_the_body_alone_where_no_abort_can_follow(
    engine: str, route: str, raw: bytes
) -> None:
    assert aborts().tag(engine, route, raw, "r") == (raw, None)


def test_tag_without_an_upstream_never_tags() -> None:
    assert Aborts().tag(SG, CHAT, b'{"model":"m"}', "r") == (b'{"model":"m"}', None)


async def test_send_posts_the_rid_and_counts_the_result() -> None:
    sg = FakeEngine(SG)
    up = FakeUpstream(sg)
    counted: list[str] = []
    a = aborts(up, counted)
    a.send(SG, "req-1-abcd")
    a.send("http://gone:8000", "req-2")  # unknown engine: the fake cannot connect
    await eventually(lambda: a.pending == 0)
    assert sg.fetched == [("/abort_request", b'{"rid":"req-1-abcd"}')]
    assert sorted(counted) == ["failed", "sent"]


async def test_send_bounded_extra_aborts_dropped_and_close_cancels_the_rest() -> None:
    sg = FakeEngine(SG, hang_fetch=True)
    counted: list[str] = []
    a = aborts(FakeUpstream(sg), counted)
    for i in range(abort.MAX_PENDING + 3):
        a.send(SG, f"r{i}")
    assert a.pending == abort.MAX_PENDING
    assert counted == ["dropped"] * 3
    await a.close()
    assert a.pending == 0


def test_engine_kind_static_entry_then_dns_name_then_vllm() -> None:
    dns = DnsEngines("engines", kind="sglang")
    src = EngineSources(static=(SG, VL), dns=(dns,), static_kinds={SG: "sglang"})
    found = "http://10.0.0.9:8000"
    assert [
        src.kind_of(u, s) for u, s in ((SG, "static"), (VL, "static"), (found, dns.source))
    ] == [
        "sglang",
        "vllm",
        "sglang",
    ]
    assert src.kind_of(found, "pods") == "vllm"
    assert EngineSources(static=(VL,)).kind_of("http://10.0.0.9:8000") == "vllm"
