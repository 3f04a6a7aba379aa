"""A split request's answer as its client gets it: without the protocols' own fields.

``Stripped`` wraps the decode engine's response for the exchange's relays
(router.gateway.upstream.relay), which then work as for any answer: a 200 JSON answer is read
whole (up to ``STRIP_BYTES``; a larger one passes as it came) and given back with
``wire.strip_json`` applied; an event stream is cut at event boundaries and each piece given
back with ``wire.strip_event`` applied (a piece of an event waits for its end, up to
``STRIP_BYTES``); any other answer passes untouched. Its ``Content-Length`` is dropped, since
the body may shrink. ``StrippingUpstream`` hands out such responses, and says whether the
first bytes of one have arrived (``answered``): until then, a split may still give up on its
decode attempt.
"""

from __future__ import annotations

import re

from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

from router.gateway.disagg import wire
from router.gateway.upstream.client import (
    MAX_FETCH_BYTES,
    Upstream,
    UpstreamRequest,
    UpstreamResponse,
)

# What one answer may hold back to strip: the relays hold a non-streamed answer this large
# anyway (router.gateway.upstream.relay's HOLD_BYTES), and an event is far smaller.
STRIP_BYTES = 1024 * 1024
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class Stripped:
    """An ``UpstreamResponse`` whose body reaches the client without ``wire.PRIVATE``."""

    __slots__ = ("_pending", "_resp", "_stream", "_whole", "headers", "on_bytes", "status")

    def __init__(self, resp: UpstreamResponse, on_bytes: StrippingUpstream | None = None) -> None:
        self._resp = resp
        self.status = resp.status
        ctype = resp.headers.get("Content-Type", "")
        self._stream = resp.status == 200 and ctype.startswith("text/event-stream")
        self._whole = resp.status == 200 and not self._stream
        self._pending = b""
        self.on_bytes = on_bytes
        self.headers: MultiMapping[str] = CIMultiDictProxy(
            CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() != "content-length")
        )

    async def read_chunk(self) -> bytes:
        if self._whole:
            self._whole = False
            chunk = await self._read_whole()
        elif self._stream:
            chunk = await self._read_events()
        else:
            chunk = await self._resp.read_chunk()
        if chunk and self.on_bytes is not None:
            self.on_bytes.answered = True
        return chunk

    async def _read_whole(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while size <= STRIP_BYTES:
            chunk = await self._resp.read_chunk()
            if not chunk:
                return wire.strip_json(b"".join(parts))
            parts.append(chunk)
            size += len(chunk)
            if self._resp.finished():
                return wire.strip_json(b"".join(parts))
        return b"".join(parts)  # too large to hold: the rest passes as it comes

    async def _read_events(self) -> bytes:
        while True:
            chunk = await self._resp.read_chunk()
            if not chunk:  # the end: what is left goes as it is
                rest, self._pending = self._pending, b""
                return wire.strip_event(rest)
            if not self._pending and chunk.endswith(b"\n\n"):
                return wire.strip_event(chunk)  # whole events, as engines send them
            data = self._pending + chunk
            ends = [m.end() for m in _EVENT_END.finditer(data)]
            cut = ends[-1] if ends else 0
            if not cut and len(data) <= STRIP_BYTES:
                self._pending = data
                continue
            if not cut:  # an event larger than anything an engine sends: passed on as it is
                self._pending = b""
                return data
            self._pending = data[cut:]
            return wire.strip_event(data[:cut])

    def finished(self) -> bool:
        return not self._pending and self._resp.finished()

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.abort()


class StrippingUpstream:
    """``Upstream`` whose answers are ``Stripped``; ``answered``: one has sent bytes."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self.answered = False

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        return Stripped(await self._upstream.send(request), self)

    async def fetch(
        self,
        engine: str,
        path: str,
        seconds: float,
        body: bytes | None = None,
        limit: int = MAX_FETCH_BYTES,
    ) -> tuple[int, bytes]:
        return await self._upstream.fetch(engine, path, seconds, body, limit)

    async def close(self) -> None:
        await self._upstream.close()
