"""HTTP/1.1 framing with no I/O: a response fed in any pieces parses the same; requests as bytes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.gateway.upstream import client as upstream_mod
from router.gateway.upstream.http1 import MAX_HEAD_BYTES, ResponseParser, WireError, request_bytes

CHAT = "/v1/chat/completions"


# -- framing, no I/O --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    raw: bytes
    status: int
    body: bytes
    reusable: bool
    headers: dict[str, str] = field(default_factory=dict)
    until_close: bool = False  # the body ends when the connection does


SSE_EVENTS = [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', b"data: [DONE]\n\n"]
CHUNKED = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in SSE_EVENTS) + b"0\r\n\r\n"
CASES = {
    "chunked-event-stream": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED,
        200,
        b"".join(SSE_EVENTS),
        True,
        {"Content-Type": "text/event-stream"},
    ),
    "chunk-extensions-trailers-uppercase-hex": Case(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        b"1A;name=value\r\n" + b"z" * 26 + b"\r\n3 ; x\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
        200,
        b"z" * 26 + b"abc",
        True,
    ),
    "content-length": Case(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
        b'{"error":1}',
        503,
        b'{"error":1}',
        True,
        {"X-A": "1"},
    ),
    "content-length-zero-no-reason": Case(
        b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 200, b"", True
    ),
    "repeated-equal-content-length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", 200, b"ok", True
    ),
    "connection-close": Case(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok",
        200,
        b"ok",
        False,
    ),
    "http-1.0": Case(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
    "until-close": Case(b"HTTP/1.1 200 OK\r\n\r\nall of it", 200, b"all of it", False, {}, True),
    "unknown-coding-until-close": Case(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw", 200, b"raw", False, {}, True
    ),
    "interim-responses-skipped": Case(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        200,
        b"ok",
        True,
    ),
    "no-content": Case(b"HTTP/1.1 204 No Content\r\nX-B: y\r\n\r\n", 204, b"", True, {"X-B": "y"}),
    "chunked-and-length-read-by-chunks-then-closed": Case(
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n",
        200,
        b"ok",
        False,
    ),
    "header-value-spaces-and-utf8": Case(
        b"HTTP/1.1 200 OK\r\nX-Name:  caf\xc3\xa9 \t\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
        200,
        b"",
        True,
        {"X-Name": "café", "X-Empty": ""},
    ),
}


def parse_pieces(pieces: list[bytes], until_close: bool) -> tuple[ResponseParser, bytes]:
    p = ResponseParser()
    body = []
    for piece in pieces:
        p.feed(piece)
        body.extend(p.body)
        p.body.clear()
    if until_close:
        assert not p.complete
        p.eof()
    return p, b"".join(body)


def check(case: Case, pieces: list[bytes]) -> None:
    p, body = parse_pieces(pieces, case.until_close)
    assert p.complete
    assert (p.status, body, p.reusable) == (case.status, case.body, case.reusable)
    assert p.headers is not None
    for k, v in case.headers.items():
        assert p.headers[k] == v


@pytest.mark.parametrize("name", list(CASES))
def test_parser_split_at_every_boundary_same_response(name: str) -> None:
    case = CASES[name]
    raw = case.raw
    check(case, [raw])
    check(case, [raw[i : i + 1] for i in range(len(raw))])
    for cut in range(1, len(raw)):
        check(case, [raw[:cut], raw[cut:]])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(list(CASES)), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_parser_any_pieces_same_response(name: str, cuts: list[int]) -> None:
    case = CASES[name]
    bounds = sorted({0, len(case.raw), *(c % (len(case.raw) + 1) for c in cuts)})
    check(case, [case.raw[a:b] for a, b in itertools.pairwise(bounds)])


def test_parser_body_bytes_available_before_message_ends() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nfirst ha")
    assert p.status == 200 and p.body == [b"first ha"] and not p.complete
    p.body.clear()
    p.feed(b"lf, then\r\n")
    assert p.body == [b"lf, then"] and not p.complete


def test_parser_bytes_after_the_response_not_reusable() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert p.complete and not p.reusable


MALFORMED = {
    "not-http": b"SSH-2.0-OpenSSH\r\n\r\n",
    "http-2-status-line": b"HTTP/2 200\r\n\r\n",
    "status-not-three-digits": b"HTTP/1.1 20 OK\r\n\r\n",
    "header-without-colon": b"HTTP/1.1 200 OK\r\nX-Bad\r\n\r\n",
    "space-in-header-name": b"HTTP/1.1 200 OK\r\nX Bad: 1\r\n\r\n",
    "obsolete-line-folding": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
    "switching-protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
    "conflicting-content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nab",
    "negative-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "chunk-size-not-hex": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk-size-signed": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\n",
    "chunk-size-too-long": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"1" * 17
    + b"\r\n",
    "chunk-data-without-crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX",
    "chunk-size-line-endless": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"1;" * 4000,
    "head-endless": b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * MAX_HEAD_BYTES,
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_parser_malformed_wire_error(name: str) -> None:
    raw = MALFORMED[name]
    with pytest.raises(WireError):
        ResponseParser().feed(raw)
    with pytest.raises(WireError):  # the same, one byte at a time
        p = ResponseParser()
        for i in range(len(raw)):
            p.feed(raw[i : i + 1])


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-", "before its head ended"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "in the middle of the body"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", "in the middle"),
    ],
    ids=["in-head", "short-content-length", "no-last-chunk"],
)
def test_parser_eof_before_the_end_wire_error(raw: bytes, where: str) -> None:
    p = ResponseParser()
    p.feed(raw)
    with pytest.raises(WireError, match=where):
        p.eof()


# -- request bytes -----------------------------------------------------------------------------


def test_request_bytes_line_host_headers_length_body() -> None:
    target = upstream_mod._Target.of("http://engine-a:8000/api")
    headers = (("Content-Type", "application/json"), ("X-Name", "café"))
    got = request_bytes("POST", target.base_path + CHAT, target.authority, headers, b'{"a":1}')
    assert got == (
        b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: engine-a:8000\r\n"
        b"Content-Type: application/json\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 7\r\n\r\n"
        b'{"a":1}'
    )
    v6 = upstream_mod._Target.of("http://[::1]:9")
    assert request_bytes("GET", v6.base_path + "/health", v6.authority, (), b"") == (
        b"GET /health HTTP/1.1\r\nHost: [::1]:9\r\n\r\n"
    )


@pytest.mark.parametrize(
    "value", ["a\r\nX-Smuggled: 1", "a\nb", "a\rb", "nul\x00", "bell\x07", "del\x7f"]
)
def test_request_bytes_line_break_or_control_in_header_refused(value: str) -> None:
    with pytest.raises(ValueError, match="control character"):
        request_bytes("POST", CHAT, "e:1", (("X-A", value),), b"{}")
    # A tab is allowed in a field value.
    assert b"X-A: a\tb\r\n" in request_bytes("POST", CHAT, "e:1", (("X-A", "a\tb"),), b"{}")
