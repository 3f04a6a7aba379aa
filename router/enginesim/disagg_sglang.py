"""SGLang's rendezvous: a prefill engine's bootstrap server, where both sides of a room meet.

SGLang sends one request to a prefill and a decode server at once, with the same
``bootstrap_room``. The prefill server waits for the decode side to arrive (its bootstrap),
learns how much of the prompt the decode side holds already, prefills, and sends the rest; the
decode side waits for that, then decodes. Here the prefill engine's bootstrap server (its own
port, ``--bootstrap-port``) is where they meet:

    POST /rooms/{room} {"prefix_tokens": N}   (the decode engine, arriving)
    -> 200 {"send_tokens": M}                 once the room's prefill has finished
    GET /health -> 200

A room lives while either side is in it (``Rooms``, bounded): the side that leaves early (an
abort, a closed connection, its timeout) wakes the other, which then fails; a side waits for
the other at most ``RoleSettings.wait_seconds``. Failures answer 500 in the engine's error
shape, as SGLang's servers report a failed bootstrap or transfer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from router import hostport
from router.enginesim.disagg_vllm import CONNECT_SECONDS, TransferFailed, answer_detail
from router.enginesim.disagg_wire import Bootstrap
from router.gateway.openai.errors import (
    BadRequest,
    GatewayError,
    TooBusy,
    error_middleware,
    vllm_dialect,
)
from router.gateway.openai.request import json_object

# Rooms open at once, at most: a new one past this is refused.
MAX_ROOMS = 4096
_BODY_BYTES = 4096


@dataclass(slots=True)
class Room:
    """One request's meeting place: what each side has said, and who is still there."""

    prefix_tokens: int | None = None  # the decode side's cached prefix, once it arrived
    send_tokens: int | None = None  # set when the prefill has finished
    taken: bool = False  # the decode side has the KV
    prefill: bool = False  # a prefill side is in the room
    decode: bool = False  # a decode side is in the room
    gone: set[str] = field(default_factory=set)  # the sides that were here and left
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self) -> None:
        """Wake whoever waits on this room to look again."""
        self.changed.set()
        self.changed = asyncio.Event()


class Rooms:
    """The open rooms of one prefill engine."""

    def __init__(self, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds
        self._rooms: dict[int, Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def enter(self, number: int, prefill: bool) -> Room:
        """Take one side of room ``number``; refuses a second prefill or decode side."""
        room = self._rooms.get(number)
        if room is None:
            if len(self._rooms) >= MAX_ROOMS:
                raise TooBusy(f"{MAX_ROOMS} bootstrap rooms are open already")
            room = self._rooms[number] = Room()
        if (room.prefill if prefill else room.decode) or room.taken:
            side = "prefill" if prefill else "decode"
            raise BadRequest(f"bootstrap room {number} has a {side} side already", "bootstrap_room")
        if prefill:
            room.prefill = True
        else:
            room.decode = True
        room.note()
        return room

    def leave(self, number: int, room: Room, prefill: bool) -> None:
        if prefill:
            room.prefill = False
        else:
            room.decode = False
        room.gone.add("prefill" if prefill else "decode")
        room.note()
        if not room.prefill and not room.decode and self._rooms.get(number) is room:
            del self._rooms[number]

    async def wait(self, room: Room, ready: str, other: str, what: str) -> None:
        """Until the room's ``ready`` attribute is set; raises ``TransferFailed`` when the
        ``other`` side left first or did not come within ``wait_seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        while getattr(room, ready) is None or getattr(room, ready) is False:
            if other in room.gone:
                raise TransferFailed(f"{what}: the {other} side left")
            left = deadline - loop.time()
            if left <= 0:
                raise TransferFailed(f"{what}: no answer within {self.wait_seconds:g} s")
            changed = room.changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                continue


def bootstrap_app(rooms: Rooms) -> web.Application:
    """The bootstrap server's app: the decode side's meeting route and a health check."""
    app = web.Application(
        middlewares=[error_middleware(_BODY_BYTES, vllm_dialect)], client_max_size=_BODY_BYTES
    )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def arrive(request: web.Request) -> web.StreamResponse:
        try:
            number = int(request.match_info["room"])
        except ValueError:
            raise BadRequest("the room must be an integer", "bootstrap_room") from None
        prefix = json_object(await request.read()).get("prefix_tokens")
        if not isinstance(prefix, int) or isinstance(prefix, bool) or prefix < 0:
            raise BadRequest("'prefix_tokens' must be a non-negative integer", "prefix_tokens")
        room = rooms.enter(number, prefill=False)
        try:
            room.prefix_tokens = prefix
            room.note()
            try:
                await rooms.wait(room, "send_tokens", "prefill", f"room {number}")
            except TransferFailed as exc:
                raise GatewayError(str(exc)) from exc
            resp = web.json_response({"send_tokens": room.send_tokens})
            await resp.prepare(request)
            await resp.write_eof()
            room.taken = True
            return resp
        finally:
            rooms.leave(number, room, prefill=False)

    app.add_routes([web.post("/rooms/{room}", arrive), web.get("/health", health)])
    return app


async def meet(
    session: aiohttp.ClientSession,
    bootstrap: Bootstrap,
    prefix_tokens: int,
    wait_seconds: float,
    headers: dict[str, str],
) -> int:
    """Meet the prefill side of ``bootstrap``'s room; the tokens it sent, once it has."""
    if bootstrap.host is None or bootstrap.port is None or bootstrap.room is None:
        raise TransferFailed(
            "decode bootstrap failed: the request names no prefill server "
            f"(bootstrap_host={bootstrap.host}, bootstrap_port={bootstrap.port}, "
            f"bootstrap_room={bootstrap.room})"
        )
    where = hostport.join(bootstrap.host, bootstrap.port)
    timeout = aiohttp.ClientTimeout(total=wait_seconds + CONNECT_SECONDS, connect=CONNECT_SECONDS)
    url = f"http://{where}/rooms/{bootstrap.room}"
    try:
        async with session.post(
            url, json={"prefix_tokens": prefix_tokens}, headers=headers, timeout=timeout
        ) as resp:
            answer = await resp.read()
            if resp.status != 200:
                detail = answer_detail(resp.status, answer)
                raise TransferFailed(f"decode transfer failed for room {bootstrap.room}: {detail}")
            sent = json_object(answer).get("send_tokens")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransferFailed(
            f"decode bootstrap with {where} failed for room {bootstrap.room}: "
            f"{exc or type(exc).__name__}"
        ) from exc
    if not isinstance(sent, int) or isinstance(sent, bool) or sent < 0:
        raise TransferFailed(f"decode transfer failed for room {bootstrap.room}: bad answer")
    return sent
