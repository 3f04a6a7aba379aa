"""One engine's part in disaggregated serving: which side of a request it is, and that side's work.

``SimSettings.kind`` is the protocol the engine speaks, ``RoleSettings.role`` its role:

- vLLM, any role (vLLM's connectors serve both directions): a request asking for a remote
  decode is prefilled as usual and its answer says where its blocks wait
  (``router.enginesim.disagg_vllm``); a request carrying a prefill engine's
  ``kv_transfer_params`` pulls the tokens it lacks from there, waits their transfer, and is
  then admitted with those tokens cached and none of them prefilled. A pull that fails fails
  the request (500) under ``load_failure`` "fail", vLLM's default; under "recompute" the
  request prefills them itself. A request with no ``kv_transfer_params`` runs whole.
- SGLang, ``prefill`` role: a request meets its decode side in its bootstrap room
  (``router.enginesim.disagg_sglang``), is prefilled with ``max_tokens`` 1, hands the KV over
  and answers its own (ignored) response; without a room it waits the bootstrap timeout for a
  decode side that cannot come, then fails (500), as SGLang's prefill server does.
  ``decode`` role: it meets the prefill engine at ``bootstrap_host:bootstrap_port``, waits for
  its prefill, then the transfer, then decodes; with no prefill server named it fails at once
  (500), as SGLang's decode server does. ``both``: an ordinary SGLang server, fields ignored.

The transfer takes ``DisaggSettings.transfer_seconds`` of the tokens moved (``--fast``: none);
that time is part of the decode request's time to first token. A side waiting for the other
stops on ``/abort_request`` for its rid or its connection closing (both kinds: a waiting side
has generated nothing yet), and after ``RoleSettings.wait_seconds`` at the latest. Its
failures are answered before any byte, streamed or not (vLLM's and SGLang's servers send a
stream's headers first and report such a failure in the stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from router import hostport
from router.enginesim.disagg_sglang import Room, Rooms, bootstrap_app, meet
from router.enginesim.disagg_vllm import HeldKv, TransferFailed, pull, serve_pull
from router.enginesim.disagg_wire import Bootstrap, RemoteKv, remote_prefill_params
from router.enginesim.engine import Engine, Ticket
from router.enginesim.requests import Generation
from router.enginesim.responses import Reply
from router.gateway.openai.errors import GatewayError

_NO_BOOTSTRAP = Bootstrap(None, None, None)
_WILDCARDS = ("", "0.0.0.0", "::")


class Side:
    """One request's part, as the app runs it: what it admits, then the side's own steps."""

    def __init__(self, gen: Generation, transferred: int = 0) -> None:
        self.gen = gen
        self.transferred = transferred  # prompt tokens whose KV came from the other engine

    async def handover(self, ticket: Ticket) -> None:
        """Before the answer: give the prefilled KV to the decode side (SGLang's prefill)."""

    def answer(self, reply: Reply) -> Reply:
        """The reply as this side gives it (vLLM's prefill: where its blocks wait)."""
        return reply

    def close(self) -> None:
        """The request is over."""


class _VllmPrefill(Side):
    def __init__(self, disagg: Disagg, gen: Generation) -> None:
        super().__init__(gen)
        self.disagg = disagg

    def answer(self, reply: Reply) -> Reply:
        # vLLM's connector holds the blocks of a prefill that ran into its token limit only;
        # a streamed answer has no place for the params.
        if reply.gen.finish_reason != "length" or reply.gen.stream:
            return reply
        d = self.disagg
        ids = d.held.hold(reply.id, self.gen.prompt_tokens, d.engine.settings.spec.block_tokens)
        params = remote_prefill_params(ids, d.engine_id, reply.id, d.host, d.port)
        return dataclasses.replace(reply, extra={"kv_transfer_params": params})


class _SglangPrefill(Side):
    def __init__(self, disagg: Disagg, gen: Generation, number: int, room: Room) -> None:
        super().__init__(dataclasses.replace(gen, max_tokens=1))
        self.disagg = disagg
        self.number = number
        self.room = room
        self.prompt_tokens = gen.prompt_tokens

    async def handover(self, ticket: Ticket) -> None:
        d = self.disagg
        delay = ticket.schedule.first_token - d.engine.now()
        if delay > 0 and not d.engine.settings.fast:
            await asyncio.sleep(delay)  # the prefill's compute
        room = self.room
        room.send_tokens = max(0, self.prompt_tokens - (room.prefix_tokens or 0))
        room.note()
        with d.failures():
            await d.rooms.wait(room, "taken", "decode", f"KV hand-over for room {self.number}")

    def close(self) -> None:
        self.disagg.rooms.leave(self.number, self.room, prefill=True)


class Disagg:
    """The disaggregation state of one engine: held blocks, rooms, its peers' client."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings.roles
        self.engine_id = str(uuid.uuid4())
        wait = self.settings.wait_seconds
        self.held = HeldKv(wait, self._expired)
        self.rooms = Rooms(wait)
        # Where this engine serves pulls (its HTTP address; router.enginesim.app.serving).
        self.host, self.port = hostport.LOOPBACK, 0
        self.bootstrap_port: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._waiting: dict[str, list[Callable[[], None]]] = {}
        headers = {"Content-Type": "application/json"}
        if engine.settings.api_key:
            headers["Authorization"] = f"Bearer {engine.settings.api_key}"
        self._headers = headers

    @property
    def _sglang_pd(self) -> bool:
        return self.engine.settings.kind == "sglang" and self.settings.role != "both"

    def serving_at(self, host: str, port: int) -> None:
        """The engine listens on ``host:port``: what its ``kv_transfer_params`` name."""
        if host in _WILDCARDS:
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = socket.gethostname()
        self.host, self.port = host, port

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """The peers' client, and the bootstrap server of an SGLang prefill engine."""
        self._session = aiohttp.ClientSession()
        runner = None
        try:
            if self._sglang_pd and self.settings.role == "prefill":
                runner = web.AppRunner(
                    bootstrap_app(self.rooms), access_log=None, handler_cancellation=True
                )
                await runner.setup()
                await web.TCPSite(runner, self.settings.host, self.settings.bootstrap_port).start()
                self.bootstrap_port = runner.addresses[0][1]
            yield
        finally:
            self.held.close()
            if runner is not None:
                await runner.cleanup()
            await self._session.close()

    async def serve_pull(self, request: web.Request) -> web.Response:
        """POST /kv/pull: a decode engine reads a prefill's blocks (``disagg_vllm``)."""
        answer = serve_pull(await request.read(), self.engine_id, self.held)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def arrive(self, gen: Generation, rid: str, close: Callable[[], None]) -> Side:
        """This engine's side of ``gen``, its wait for the other engine done; raises a
        ``GatewayError`` (a 500) when the other side fails it."""
        pd = gen.pd
        if self._sglang_pd:
            with self._abortable(rid, close):
                if self.settings.role == "prefill":
                    return await self._sglang_prefill(gen, pd.bootstrap or _NO_BOOTSTRAP, rid)
                return await self._sglang_decode(gen, pd.bootstrap or _NO_BOOTSTRAP)
        if self.engine.settings.kind == "vllm" and pd.remote_prefill is not None:
            with self._abortable(rid, close):
                return await self._vllm_decode(gen, pd.remote_prefill)
        if self.engine.settings.kind == "vllm" and pd.remote_decode:
            self.engine.counters.prefilled_for_remote += 1
            return _VllmPrefill(self, gen)
        self.engine.counters.whole += 1
        return Side(gen)

    async def _vllm_decode(self, gen: Generation, remote: RemoteKv) -> Side:
        lacks = gen.prompt_tokens - self.engine.held_tokens(gen.keys, gen.prompt_tokens)
        try:
            await pull(self._client(), remote, lacks, self.settings.wait_seconds, self._headers)
        except TransferFailed as exc:
            self.engine.counters.transfer_failures += 1
            if self.settings.load_failure == "fail":
                raise GatewayError(str(exc)) from exc
            self.engine.counters.whole += 1
            return Side(gen)  # recompute: prefill the missing tokens here
        await self._transfer(lacks)
        self.engine.counters.decoded_from_remote += 1
        return Side(gen, lacks)

    async def _sglang_prefill(self, gen: Generation, boot: Bootstrap, rid: str) -> Side:
        if boot.room is None:
            # Its decode side cannot find it: the bootstrap waits out its timeout.
            await asyncio.sleep(self.settings.wait_seconds)
            self.engine.counters.transfer_failures += 1
            raise GatewayError(
                f"Prefill bootstrap failed for request rid={rid!r}: no bootstrap_room, "
                f"no decode side within {self.settings.wait_seconds:g} s"
            )
        room = self.rooms.enter(boot.room, prefill=True)
        try:
            with self.failures():
                await self.rooms.wait(
                    room, "prefix_tokens", "decode", f"prefill bootstrap for room {boot.room}"
                )
        except BaseException:
            self.rooms.leave(boot.room, room, prefill=True)
            raise
        self.engine.counters.prefilled_for_remote += 1
        return _SglangPrefill(self, gen, boot.room, room)

    async def _sglang_decode(self, gen: Generation, boot: Bootstrap) -> Side:
        held = self.engine.held_tokens(gen.keys, gen.prompt_tokens)
        with self.failures():
            sent = await meet(self._client(), boot, held, self.settings.wait_seconds, self._headers)
        await self._transfer(sent)
        self.engine.counters.decoded_from_remote += 1
        return Side(gen, gen.prompt_tokens - held)

    async def _transfer(self, tokens: int) -> None:
        link = self.settings.link
        seconds = link.transfer_seconds(tokens)
        c = self.engine.counters
        c.transferred_tokens += tokens
        c.transferred_bytes += link.transfer_bytes(tokens)
        c.transfer_seconds += seconds
        if seconds > 0 and not self.engine.settings.fast:
            await asyncio.sleep(seconds)

    @contextmanager
    def failures(self) -> Iterator[None]:
        """A ``TransferFailed`` raised in the block, counted, as the request's 500."""
        try:
            yield
        except TransferFailed as exc:
            self.engine.counters.transfer_failures += 1
            raise GatewayError(str(exc)) from exc

    @contextmanager
    def _abortable(self, rid: str, close: Callable[[], None]) -> Iterator[None]:
        closers = self._waiting.setdefault(rid, [])
        closers.append(close)
        self.engine.pd_waiting += 1
        try:
            yield
        finally:
            self.engine.pd_waiting -= 1
            closers.remove(close)
            if not closers and self._waiting.get(rid) is closers:
                del self._waiting[rid]

    def abort(self, rid: str | None) -> int:
        """Stop the requests of ``rid`` (None: all) waiting for their other side."""
        if rid is None:
            closers = [c for cs in self._waiting.values() for c in cs]
        else:
            closers = list(self._waiting.get(rid, ()))
        for close in closers:
            self.engine.counters.aborted += 1
            close()
        return len(closers)

    def stats(self) -> dict[str, Any]:
        """The role's state for ``/stats`` (its counters are the engine's)."""
        return {
            "engine_id": self.engine_id,
            "bootstrap_port": self.bootstrap_port,
            "link_gbps": self.settings.link.link_gbps,
            "kv_bytes_per_token": self.settings.link.kv_bytes_per_token,
            "kv_held": len(self.held),
            "rooms": len(self.rooms),
        }

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the engine's app has not started")
        return self._session

    def _expired(self) -> None:
        self.engine.counters.kv_expired += 1
