"""The two protocols' bodies (router.gateway.disagg.wire): against every fixture of the
peers' proxies present (tests/fixtures/pd), and their rules one by one."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.core.disaggregation import PROTOCOLS
from router.gateway.disagg import wire
from tests.gateway.disagg.fixtures import HOST, ROOM, load_all, placed, same

FIXTURES = load_all()
VLLM = [(n, f) for n, f in FIXTURES if f["protocol"] == "vllm"]
SGLANG = [(n, f) for n, f in FIXTURES if f["protocol"] == "sglang"]


def test_fixtures_cover_both_protocols_routes_and_stream_modes() -> None:
    seen = {
        (f["protocol"], f["client"]["path"], bool(f["client"]["body"].get("stream")))
        for _, f in FIXTURES
    }
    for protocol in PROTOCOLS:
        for route in wire.SPLIT_ROUTES:
            assert {(protocol, route, True), (protocol, route, False)} <= seen


@pytest.mark.parametrize("fixture", [f for _, f in VLLM], ids=[n for n, _ in VLLM])
def test_vllm_bodies_are_the_proxys(fixture: dict[str, Any]) -> None:
    client = fixture["client"]["body"]
    assert same(wire.vllm_prefill(client), fixture["prefill"]["body"])
    answered = wire.transfer_params(orjson.dumps(fixture["prefill_answer"]))
    assert answered == fixture["prefill_answer"]["kv_transfer_params"]
    assert same(wire.vllm_decode(client, answered), fixture["decode"]["body"])
    paths = {fixture["client"]["path"], fixture["prefill"]["path"], fixture["decode"]["path"]}
    assert len(paths) == 1
    ids = {fixture[side]["headers"]["x-request-id"] for side in ("prefill", "decode")}
    assert len(ids) == 1


@pytest.mark.parametrize("fixture", [f for _, f in SGLANG], ids=[n for n, _ in SGLANG])
def test_sglang_bodies_are_the_proxys(fixture: dict[str, Any]) -> None:
    client = fixture["client"]["body"]
    for side in ("prefill", "decode"):
        want = fixture[side]["body"]
        ours = wire.sglang(client, "prefill-0", want["bootstrap_port"], wire.new_room())
        assert same(placed(ours, want), want)
    assert fixture["prefill"]["body"] == fixture["decode"]["body"]


def test_vllm_prefill_keeps_the_clients_order_and_sets_its_own_in_place() -> None:
    client = {"kv_transfer_params": {"remote_host": "evil"}, "model": "m", "stream": True}
    body = wire.vllm_prefill(client)
    assert list(body) == ["kv_transfer_params", "model", "stream", "max_tokens"]
    assert body["kv_transfer_params"] == wire.REMOTE_DECODE and body["stream"] is False
    assert client == {"kv_transfer_params": {"remote_host": "evil"}, "model": "m", "stream": True}


def test_vllm_decode_drops_a_clients_kv_transfer_params_when_the_prefill_answered_none() -> None:
    client = {"model": "m", "kv_transfer_params": {"remote_host": "10.9.9.9"}}
    assert wire.vllm_decode(client, None) == {"model": "m"}
    assert wire.vllm_decode(client, {"remote_port": 1}) == {
        "model": "m",
        "kv_transfer_params": {"remote_port": 1},
    }


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b'{"kv_transfer_params": {"remote_port": 7}}', {"remote_port": 7}),
        (b'{"kv_transfer_params": null}', None),
        (b'{"kv_transfer_params": {}}', None),
        (b'{"kv_transfer_params": [1]}', None),
        (b"[1, 2]", None),
        (b"not json", None),
        (b"{}", None),
    ],
    ids=["object", "null", "empty", "array", "no-object", "no-json", "absent"],
)
def test_transfer_params_reads_only_an_object(answer: bytes, expected: Any) -> None:
    assert wire.transfer_params(answer) == expected


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://10.0.0.7:30000", "10.0.0.7"),
        ("http://Prefill-0.pool.svc:8000", "prefill-0.pool.svc"),
        ("http://[fd00::7]:8000", "[fd00::7]"),
    ],
)
def test_bootstrap_host_is_the_prefill_engines_host(url: str, host: str) -> None:
    assert wire.bootstrap_host(url) == host


def test_rooms_are_63_bit_and_differ() -> None:
    rooms = {wire.new_room() for _ in range(64)}
    assert len(rooms) == 64 and all(0 <= r < 2**63 for r in rooms)


def test_sglang_sets_the_bootstrap_fields_last_or_in_place() -> None:
    body = wire.sglang({"bootstrap_room": 1, "model": "m"}, "h", None, 5)
    assert list(body) == ["bootstrap_room", "model", "bootstrap_host", "bootstrap_port"]
    assert body["bootstrap_room"] == 5 and body["bootstrap_port"] is None
    assert ROOM and HOST  # the fixtures' placeholders, compared above


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"id":"x","kv_transfer_params":null,"choices":[]}', b'{"id":"x","choices":[]}'),
        (
            b'{"a":1,"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":2}',
            b'{"a":1}',
        ),
        (b'{"a":{"kv_transfer_params":1}}', b'{"a":{"kv_transfer_params":1}}'),  # not top-level
        (b'{"a": 1}', b'{"a": 1}'),  # nothing to take: the same bytes
        (b'["kv_transfer_params"]', b'["kv_transfer_params"]'),
        (b'{"kv_transfer_params": broken', b'{"kv_transfer_params": broken'),
    ],
    ids=["vllm-null", "bootstrap", "nested", "untouched", "array", "broken"],
)
def test_strip_json_takes_only_top_level_private_fields(body: bytes, expected: bytes) -> None:
    assert wire.strip_json(body) == expected


def test_strip_event_strips_each_data_line_and_keeps_the_rest() -> None:
    events = (
        b": comment\r\n"
        b'data: {"choices":[],"kv_transfer_params":null}\r\n\r\n'
        b'data:{"choices":[1]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert wire.strip_event(events) == (
        b': comment\r\ndata: {"choices":[]}\r\n\r\ndata:{"choices":[1]}\n\ndata: [DONE]\n\n'
    )
    untouched = b'data: {"choices":[]}\n\n'
    assert wire.strip_event(untouched) is untouched
