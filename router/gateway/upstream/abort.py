"""Telling an engine that a request's client has gone.

Closing the engine's connection is the signal every engine understands, and the exchange closes
it on every exit that leaves an answer unread: queued (nothing was sent), before the first byte,
mid-stream. vLLM stops the request there and then. SGLang may notice a closed connection only
seconds later, but stops at once on ``POST /abort_request {"rid": RID}``; its OpenAI routes take
the request's rid from the body's ``rid`` (recent versions, without one, make it
``chatcmpl-`` + ``X-Request-Id``), and refuse a rid already in flight.

So for an engine of kind ``sglang`` (``engines.static[].kind``, ``engines.dns.kind``) the body of
each attempt on a generation route names its own rid (``Aborts.tag``): the request id plus a
random suffix, since client-chosen request ids may repeat. The bytes are the client's with one
member put in front, so nothing is re-serialised. A body that mentions ``"rid"`` anywhere is left
as it is (the client may name its own rid) and gets no abort. When the client leaves before its
answer is complete, ``Aborts.send`` posts the abort in the background: at most
``MAX_PENDING`` at once (more are dropped and counted: the closed connection still stops the
request in the end), each within ``ABORT_SECONDS``, all cancelled when the gateway stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Callable

import orjson

from router.gateway.openai.errors import UpstreamError
from router.gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

ABORT_PATH = "/abort_request"
# The routes whose SGLang handlers read the body's rid and generate (embeddings finish at once).
RID_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
# An abort is one small POST on loopback or in-cluster; one that takes longer is pointless.
ABORT_SECONDS = 2.0
# Aborts in flight at once: a burst of disconnects must not become a burst of tasks.
MAX_PENDING = 256
# A regular expression finds it three times faster than ``in`` does in JSON, whose many
# quotes each start a partial match (bench/RESULTS.md, "Reading sessions, aliases, abort ids").
_RID_KEY = re.compile(rb'"rid"')


def never(_engine: str) -> str:
    """The kind of every engine when none is configured: close-the-connection engines."""
    return "vllm"


class Aborts:
    """Which engines take an abort, the rid each attempt there carries, and the aborts sent."""

    def __init__(
        self,
        upstream: Upstream | None = None,
        kind_of: Callable[[str], str] = never,
        count: Callable[[str], None] = lambda _result: None,
    ) -> None:
        self._upstream = upstream
        self._kind_of = kind_of
        self._count = count
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def tag(self, engine: str, route: str, raw: bytes, request_id: str) -> tuple[bytes, str | None]:
        """The body to send ``engine`` and the rid it names (None: no abort is possible)."""
        if self._upstream is None or route not in RID_ROUTES or self._kind_of(engine) != "sglang":
            return raw, None
        if _RID_KEY.search(raw) is not None:
            return raw, None
        rid = f"{request_id}-{secrets.token_hex(4)}"
        start = raw.index(b"{") + 1  # the body parsed as a JSON object: this is where it opens
        return raw[:start] + b'"rid":' + orjson.dumps(rid) + b"," + raw[start:], rid

    def send(self, engine: str, rid: str) -> None:
        """Ask ``engine`` to stop ``rid``, in the background (the client has gone)."""
        if self._upstream is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self._count("dropped")
            return
        task = asyncio.get_running_loop().create_task(self._post(self._upstream, engine, rid))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, upstream: Upstream, engine: str, rid: str) -> None:
        try:
            status, _ = await upstream.fetch(
                engine, ABORT_PATH, ABORT_SECONDS, orjson.dumps({"rid": rid})
            )
        except UpstreamError as e:
            log.info("abort of %s at %s failed: %s", rid, engine, e)
            self._count("failed")
            return
        if status != 200:
            log.info("abort of %s at %s answered %d", rid, engine, status)
            self._count("failed")
            return
        log.debug("aborted %s at %s", rid, engine)
        self._count("sent")

    async def close(self) -> None:
        """Cancel the aborts still in flight (the gateway is stopping)."""
        tasks = list(self._pending)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pending.clear()  # their done callbacks may not have run yet
