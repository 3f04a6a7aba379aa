"""Server-Sent Events framing with no I/O: bytes in, events out; values in, bytes out.

``Decoder.feed`` follows the WHATWG event-stream rules: lines end with ``\\r\\n``, ``\\n`` or
``\\r``; ``data:`` lines of one event join with ``\\n``; a blank line dispatches; lines starting
with ``:`` are comments; ``id:`` sets the last event id, which later events keep until the next
``id:``; an event with no ``data:`` line is not dispatched; a UTF-8 BOM at the very start is
dropped. The decoder works on bytes and keeps an unfinished line or event for the next chunk,
so a stream yields the same events whatever its chunk boundaries.

``encode`` writes events the way vLLM's OpenAI server does (``data: ...\\n\\n``) under
``HEADERS``; ``DONE`` ends an OpenAI stream and ``error_event`` ends a stream that failed after
its first byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["DONE", "HEADERS", "Decoder", "Event", "SSEError", "encode", "error_event"]

DONE = b"data: [DONE]\n\n"
# The response headers of an event stream, as OpenAI-compatible servers send them.
HEADERS = MappingProxyType({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
# Bytes of one unfinished event held at most: an engine never sends a chunk near this, so a
# stream that does is broken, and buffering it forever would let it take all memory.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSEError(ValueError):
    """The stream broke a limit of the decoder (an event too large to buffer)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: its data, its type and the last event id seen on the stream."""

    data: str
    event: str = "message"
    id: str | None = None

    @property
    def done(self) -> bool:
        """True for OpenAI's end-of-stream sentinel ``[DONE]``."""
        return self.data == "[DONE]"


class Decoder:
    """Incremental event-stream decoder: ``feed`` chunks, get the events they complete."""

    __slots__ = (
        "_data",
        "_data_bytes",
        "_event",
        "_last_id",
        "_line",
        "_line_bytes",
        "_max_bytes",
        "_skip_lf",
        "_started",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_bytes = max_event_bytes
        self._line: list[bytes] = []  # pieces of the current, unterminated line
        self._data: list[bytes] = []  # ``data:`` values of the current event
        self._event: bytes = b""
        self._last_id: str | None = None
        self._line_bytes = 0
        self._data_bytes = 0
        self._skip_lf = False  # the last chunk ended in CR: an LF next belongs to it
        self._started = False

    @property
    def pending(self) -> bool:
        """True while part of an event is buffered (a stream ending now was cut short)."""
        return bool(self._line or self._data or self._event)

    def feed(self, chunk: bytes) -> list[Event]:
        """Consume ``chunk`` and return the events it completes, in order."""
        if not chunk:
            return []
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = chunk[-1:] == b"\r"
        events: list[Event] = []
        start = 0
        for m in _EOL.finditer(chunk):
            line = chunk[start : m.start()]
            if self._line:
                self._line.append(line)
                line = b"".join(self._line)
                self._line.clear()
                self._line_bytes = 0
            self._take_line(line, events)
            start = m.end()
        if start < len(chunk):
            self._line.append(chunk[start:])
            self._line_bytes += len(chunk) - start
            self._check(self._line_bytes)
        return events

    def _check(self, size: int) -> None:
        if size > self._max_bytes:
            raise SSEError(f"event larger than {self._max_bytes} bytes")

    def _take_line(self, line: bytes, events: list[Event]) -> None:
        if not self._started:
            self._started = True
            line = line.removeprefix(_BOM)
        if not line:
            self._dispatch(events)
            return
        if line[0] == 0x3A:  # ":" starts a comment (servers send them as keep-alives)
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._data_bytes += len(value) + 1
            self._check(self._data_bytes)
        elif name == b"event":
            self._event = value
        elif name == b"id" and b"\0" not in value:  # an id with NUL is ignored, as specified
            self._last_id = value.decode("utf-8", "replace")
        # Other fields (``retry``, unknown names) do not change the events: ignored.

    def _dispatch(self, events: list[Event]) -> None:
        data, event = self._data, self._event
        self._data = []
        self._event = b""
        self._data_bytes = 0
        if not data:
            return
        events.append(
            Event(
                data=b"\n".join(data).decode("utf-8", "replace"),
                event=event.decode("utf-8", "replace") or "message",
                id=self._last_id,
            )
        )


def encode(data: str | bytes, event: str | None = None) -> bytes:
    """One event: ``event: NAME`` if named, a ``data:`` line per line of ``data``, a blank line."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if b"\n" in raw or b"\r" in raw:
        body = b"".join(b"data: " + line + b"\n" for line in _EOL.split(raw))
    else:
        body = b"data: " + raw + b"\n"
    if event is None:
        return body + b"\n"
    if "\n" in event or "\r" in event:
        raise ValueError(f"an event name cannot contain a line break: {event!r}")
    return b"event: " + event.encode("utf-8") + b"\n" + body + b"\n"


def error_event(
    message: str, error_type: str = "server_error", code: int | str | None = None
) -> bytes:
    """An OpenAI-style error event, for a stream that fails after it has started."""
    error = {"message": message, "type": error_type, "param": None, "code": code}
    return encode(json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":")))
