"""HTTP/1.1 framing with no I/O (RFC 9112): a request as bytes; a response as bytes in, then
the head, body bytes, the end.

``ResponseParser`` is fed the bytes of one response in whatever pieces they arrive and says
what they are; it is tested one byte at a time and on every two-piece split. The gateway's
``Upstream`` (router.gateway.upstream.client) moves the bytes between sockets and a parser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from multidict import CIMultiDict

# A response head (status line and headers) or a chunk's trailers larger than this is refused.
MAX_HEAD_BYTES = 64 * 1024
# A chunk-size line (hex size and extensions) longer than this is refused.
MAX_CHUNK_LINE_BYTES = 4096


class WireError(ValueError):
    """The bytes are not an HTTP/1.1 response this client can read (RFC 9112)."""


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
# Header lines, each with its CRLF: a token, a colon, a value without line breaks.
_FIELD_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*\r\n)*")
_FIELD_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*")
# A chunk-size line with its CRLF: hex size, then optional (ignored) extensions.
_CHUNK_HEAD = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
_DIGITS = re.compile(r"[0-9]{1,18}")


class ResponseParser:
    """One HTTP/1.1 response, fed as bytes in whatever pieces they arrive.

    After ``feed``: ``status`` and ``headers`` once the head is complete (interim 1xx heads are
    skipped), decoded body bytes waiting in ``body`` (the caller takes them and clears the
    list), ``complete`` once the message ended. ``eof`` says the connection closed, which ends
    a body framed by the close and breaks any other. ``reusable`` tells whether the connection
    can carry another request. Malformed input raises ``WireError`` saying what was wrong.
    """

    __slots__ = (
        "_left",
        "_pending",
        "_state",
        "body",
        "buffered",
        "complete",
        "headers",
        "reusable",
        "status",
    )

    def __init__(self) -> None:
        self.status = 0
        self.headers: CIMultiDict[str] | None = None
        self.body: list[bytes] = []
        self.buffered = 0  # bytes in ``body``, kept by the caller as it takes them
        self.complete = False
        self.reusable = False
        self._state = _HEAD
        self._left = 0  # body or chunk bytes still to come
        self._pending = b""  # an unfinished head, size line or terminator

    def feed(self, data: bytes) -> None:
        """Consume ``data``; raises ``WireError``."""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state in (_CHUNK_DATA, _LENGTH):
                take = min(self._left, end - pos)
                piece = data if take == end else data[pos : pos + take]
                self.body.append(piece)
                self.buffered += take
                self._left -= take
                pos += take
                if not self._left:
                    if state == _LENGTH:
                        self._finish()
                    else:
                        self._state = _CHUNK_END
            elif state == _CHUNK_END:
                if end - pos < 2:
                    self._pending = data[pos:]
                    return
                if data[pos : pos + 2] != b"\r\n":
                    raise WireError("a chunk's data does not end with CRLF")
                pos += 2
                self._state = _CHUNK_SIZE
            elif state == _CHUNK_SIZE:
                pos = self._chunks(data, pos, end)
                if self._state == _CHUNK_SIZE and pos < end:
                    self._pending = data[pos:]  # an unfinished chunk-size line
                    return
            elif state == _HEAD:
                eoh = data.find(b"\r\n\r\n", pos, pos + MAX_HEAD_BYTES + 4)
                if eoh < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise WireError(f"the response head is over {MAX_HEAD_BYTES} bytes")
                    self._pending = data[pos:]
                    return
                self._head(data[pos:eoh])
                pos = eoh + 4
            elif state == _TRAILERS:
                if data.startswith(b"\r\n", pos):
                    pos += 2
                    self._finish()
                    continue
                eot = data.find(b"\r\n\r\n", pos, pos + MAX_HEAD_BYTES + 4)
                if eot < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise WireError(f"the trailers are over {MAX_HEAD_BYTES} bytes")
                    self._pending = data[pos:]
                    return
                pos = eot + 4  # trailer fields are not relayed
                self._finish()
            elif state == _UNTIL_CLOSE:
                self.body.append(data if pos == 0 else data[pos:])
                self.buffered += end - pos
                return
            else:  # _DONE: bytes after the end of the response it was asked for
                self.reusable = False
                return

    def _chunks(self, data: bytes, pos: int, end: int) -> int:
        """Whole chunks from ``pos``, where a chunk-size line starts; returns where the rest
        starts. An event stream is one chunk per event: this loop is the relay's hot path."""
        body = self.body
        match = _CHUNK_HEAD.match
        taken = 0
        while pos < end:
            m = match(data, pos)
            if m is None:
                _check_chunk_line(data, pos, end)  # raises unless the line is unfinished
                break
            start = m.end()
            if start - pos > MAX_CHUNK_LINE_BYTES + 2:
                raise WireError(f"a chunk-size line is over {MAX_CHUNK_LINE_BYTES} bytes")
            size = int(m[1], 16)
            if not size:
                self._state = _TRAILERS
                pos = start
                break
            stop = start + size
            if stop + 2 > end:  # the chunk goes on in later bytes
                self._left = size
                self._state = _CHUNK_DATA
                pos = start
                break
            if data[stop] != 13 or data[stop + 1] != 10:
                raise WireError("a chunk's data does not end with CRLF")
            body.append(data[start:stop])
            taken += size
            pos = stop + 2
        self.buffered += taken
        return pos

    def eof(self) -> None:
        """The connection closed; raises ``WireError`` if the response was not complete."""
        if self._state == _UNTIL_CLOSE:
            self._finish()
        elif not self.complete:
            where = "before its head ended" if self.headers is None else "in the middle of the body"
            raise WireError(f"the connection closed {where}")

    def _finish(self) -> None:
        self._state = _DONE
        self.complete = True

    def _head(self, raw: bytes) -> None:
        eol = raw.find(b"\r\n")
        status_line, fields = (raw, b"") if eol < 0 else (raw[:eol], raw[eol + 2 :] + b"\r\n")
        m = _STATUS_LINE.fullmatch(status_line)
        if m is None:
            raise WireError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(m[2])
        http11 = m[1] == b"1"
        if status == 101:
            raise WireError("the engine switched protocols, which was never asked for")
        if status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        if _FIELD_LINES.fullmatch(fields) is None:
            bad = next(x for x in fields.split(b"\r\n") if not _FIELD_LINE.fullmatch(x))
            raise WireError(f"not a header line: {bad[:80]!r}")
        headers: CIMultiDict[str] = CIMultiDict()
        add = headers.add
        # Names are ASCII (checked above); values may carry any other byte, kept as UTF-8 with
        # escapes so that they go back out as they came.
        for line in fields.decode("utf-8", "surrogateescape").split("\r\n")[:-1]:
            name, _, value = line.partition(":")
            add(name, value.strip(" \t"))
        self.status = status
        self.headers = headers
        keep = http11
        if keep and "Connection" in headers:
            keep = "close" not in _tokens(headers.getall("Connection"))
        te = headers.getall("Transfer-Encoding", ())
        codings = ["chunked"] if te == ["chunked"] else _tokens(te)
        if status in (204, 304):
            self.reusable = keep
            self._finish()
        elif codings:
            if codings[-1] == "chunked":
                # With both Transfer-Encoding and Content-Length the message is suspect
                # (RFC 9112 section 6.3): read it by its chunks, then close the connection.
                self.reusable = keep and "Content-Length" not in headers
                self._state = _CHUNK_SIZE
            else:
                self._state = _UNTIL_CLOSE
        elif "Content-Length" in headers:
            self._left = _content_length(headers.getall("Content-Length"))
            self.reusable = keep
            self._state = _LENGTH
            if not self._left:
                self._finish()
        else:
            self._state = _UNTIL_CLOSE


def _tokens(values: list[str] | tuple[()]) -> list[str]:
    """The comma-separated tokens of a header's values, lower-cased, in order."""
    return [t.strip().lower() for v in values for t in v.split(",") if t.strip()]


def _check_chunk_line(data: bytes, pos: int, end: int) -> None:
    """Raise unless the chunk-size line at ``pos`` is merely unfinished."""
    eol = data.find(b"\r\n", pos, pos + MAX_CHUNK_LINE_BYTES + 2)
    if eol >= 0:
        raise WireError(f"not a chunk-size line: {data[pos:eol][:80]!r}")
    if end - pos > MAX_CHUNK_LINE_BYTES:
        raise WireError(f"a chunk-size line is over {MAX_CHUNK_LINE_BYTES} bytes")


def _content_length(values: list[str]) -> int:
    found = {v.strip() for value in values for v in value.split(",")}
    if len(found) != 1 or _DIGITS.fullmatch(next(iter(found))) is None:
        raise WireError(f"not a Content-Length: {', '.join(values)[:80]!r}")
    return int(found.pop())


# -- connections and the pool ---------------------------------------------------------------


# Control characters a header field must not carry; CR and LF are counted instead (below).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def request_bytes(
    method: str,
    target: str,
    authority: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
) -> bytes:
    """A request as HTTP/1.1 bytes: request line, Host, ``headers``, Content-Length, body.

    Raises ``ValueError`` when a header holds a line break or another control character,
    which would let one header smuggle others (or a second request) to the engine.
    """
    fields = "".join([f"\r\n{k}: {v}" for k, v in headers])
    n = len(headers)
    if fields.count("\n") != n or fields.count("\r") != n or _CONTROL.search(fields):
        raise ValueError("a header holds a line break or a control character")
    if body or method == "POST":
        fields += f"\r\nContent-Length: {len(body)}"
    text = f"{method} {target} HTTP/1.1\r\nHost: {authority}{fields}\r\n\r\n"
    return text.encode("utf-8", "surrogateescape") + body
