"""router.gateway.openai.sse: the decoder yields the same events whatever the chunk boundaries;
the encoder writes what the decoder reads back."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.gateway.openai.sse import DONE, Decoder, Event, SSEError, encode, error_event


def decode_all(chunks: list[bytes]) -> list[Event]:
    d = Decoder()
    return [e for c in chunks for e in d.feed(c)]


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# -- decoding: one table of streams and the events they mean ---------------------------------

DECODE_CASES = [
    pytest.param(b"data: a\n\n", [Event("a")], id="lf_endings_one_event"),
    pytest.param(b"data: a\r\n\r\n", [Event("a")], id="crlf_endings_one_event"),
    pytest.param(b"data: a\r\r", [Event("a")], id="cr_endings_one_event"),
    pytest.param(b"data: a\r\n\ndata: b\r\r", [Event("a"), Event("b")], id="mixed_endings_two"),
    pytest.param(b"data: a\ndata: b\n\n", [Event("a\nb")], id="multi_line_data_joined_with_lf"),
    pytest.param(b": keep-alive\ndata: a\n\n", [Event("a")], id="comment_line_ignored"),
    pytest.param(b": only a comment\n\n", [], id="comment_only_no_event"),
    pytest.param(b"event: ping\nid: 7\n\n", [], id="fields_without_data_no_event"),
    pytest.param(
        b"event: delta\nid: 7\ndata: x\n\n", [Event("x", "delta", "7")], id="event_and_id_kept"
    ),
    pytest.param(
        b"id: 7\ndata: x\n\ndata: y\n\n",
        [Event("x", id="7"), Event("y", id="7")],
        id="id_persists_to_later_events",
    ),
    pytest.param(
        b"id: 7\ndata: x\n\nid\ndata: y\n\n",
        [Event("x", id="7"), Event("y", id="")],
        id="bare_id_resets_to_empty",
    ),
    pytest.param(b"id: a\0b\ndata: x\n\n", [Event("x")], id="id_with_nul_ignored"),
    pytest.param(
        b"event: a\ndata: x\n\ndata: y\n\n",
        [Event("x", "a"), Event("y")],
        id="event_type_reset_after_dispatch",
    ),
    pytest.param(b"data\n\n", [Event("")], id="field_without_colon_empty_value"),
    pytest.param(b"data:\n\n", [Event("")], id="empty_data_line_empty_event"),
    pytest.param(b"data:  two\n\n", [Event(" two")], id="only_one_leading_space_stripped"),
    pytest.param(b"data:a\n\n", [Event("a")], id="no_space_after_colon_kept_whole"),
    pytest.param(b"data: a:b: c\n\n", [Event("a:b: c")], id="colons_in_value_kept"),
    pytest.param(b"retry: 10\nfoo: bar\ndata: a\n\n", [Event("a")], id="other_fields_ignored"),
    pytest.param(b"\xef\xbb\xbfdata: a\n\n", [Event("a")], id="leading_bom_stripped"),
    pytest.param(
        b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [Event("a")], id="bom_after_start_not_stripped"
    ),
    pytest.param(b"data: \xc3\xa9\xff\n\n", [Event("\xe9\ufffd")], id="bad_utf8_replaced"),
    pytest.param(b"data: a\n\ndata: b\n", [Event("a")], id="trailing_partial_event_kept"),
    pytest.param(b"\n\n\ndata: a\n\n", [Event("a")], id="leading_blank_lines_no_event"),
]


@pytest.mark.parametrize(("stream", "expected"), DECODE_CASES)
def test_decoder_feed(stream: bytes, expected: list[Event]) -> None:
    assert decode_all([stream]) == expected
    assert decode_all([bytes([b]) for b in stream]) == expected


def test_decoder_partial_event_completed_by_next_chunk() -> None:
    d = Decoder()
    assert d.feed(b'data: {"a"') == []
    assert d.pending
    assert d.feed(b": 1}\n") == []
    assert d.feed(b"\n") == [Event('{"a": 1}')]
    assert not d.pending


def test_decoder_cr_then_lf_in_next_chunk_one_line_ending() -> None:
    d = Decoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\n") == []  # the LF completes the CR, it is not a blank line
    assert d.feed(b"\r\n") == [Event("a")]


def test_decoder_done_sentinel_is_done() -> None:
    (event,) = decode_all([DONE])
    assert event.done
    assert not Event("[DONE] ").done


def test_decoder_oversized_event_raises() -> None:
    d = Decoder(max_event_bytes=16)
    with pytest.raises(SSEError):
        d.feed(b"data: " + b"x" * 32)
    d = Decoder(max_event_bytes=16)
    with pytest.raises(SSEError):
        d.feed(b"data: 0123456789\ndata: 0123456789\n")


# -- decoding: any split of any stream gives the same events ---------------------------------

PIECES = [
    b"data", b"event", b"id", b":", b": ", b" ", b"\r", b"\n", b"\r\n", b"x", b"[DONE]",
    b"\xef\xbb\xbf", b"\xc3\xa9", b"\0", b"retry",
]  # fmt: skip
streams = st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join)


@given(data=st.data(), stream=streams)
def test_decoder_any_split_same_events(data: st.DataObject, stream: bytes) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    whole, pieces = Decoder(), Decoder()
    expected = whole.feed(stream)
    got = [e for c in split_at(stream, cuts) for e in pieces.feed(c)]
    assert got == expected
    assert pieces.pending == whole.pending


@given(stream=streams)
def test_decoder_byte_at_a_time_same_events(stream: bytes) -> None:
    assert decode_all([bytes([b]) for b in stream]) == decode_all([stream])


# -- encoding -----------------------------------------------------------------------------

ENCODE_CASES = [
    pytest.param("x", None, b"data: x\n\n", id="str_plain_data_line"),
    pytest.param(b'{"a":1}', None, b'data: {"a":1}\n\n', id="bytes_plain_data_line"),
    pytest.param("a\nb", None, b"data: a\ndata: b\n\n", id="multi_line_one_data_line_each"),
    pytest.param("a\r\nb\rc", None, b"data: a\ndata: b\ndata: c\n\n", id="any_eol_splits"),
    pytest.param("x", "ping", b"event: ping\ndata: x\n\n", id="named_event_line_first"),
    pytest.param("", None, b"data: \n\n", id="empty_data_still_an_event"),
    pytest.param("[DONE]", None, DONE, id="done_matches_constant"),
]


@pytest.mark.parametrize(("data", "event", "expected"), ENCODE_CASES)
def test_encode(data: str | bytes, event: str | None, expected: bytes) -> None:
    assert encode(data, event) == expected


def test_encode_event_name_with_newline_raises() -> None:
    with pytest.raises(ValueError, match="line break"):
        encode("x", "a\nb")


def test_error_event_openai_error_shape() -> None:
    (event,) = decode_all([error_event("upstream died", "server_error", 502)])
    assert json.loads(event.data) == {
        "error": {"message": "upstream died", "type": "server_error", "param": None, "code": 502}
    }


text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
names = st.none() | text.filter(lambda s: "\r" not in s and "\n" not in s)


@given(data=st.data(), events=st.lists(st.tuples(text, names), max_size=8))
def test_encode_then_decode_round_trip(
    data: st.DataObject, events: list[tuple[str, str | None]]
) -> None:
    stream = b"".join(encode(d, e) for d, e in events)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    expected = [Event("\n".join(re.split(r"\r\n|\r|\n", d)), e or "message") for d, e in events]
    assert decode_all(split_at(stream, cuts)) == expected
