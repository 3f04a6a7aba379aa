"""A gossip node: membership, failure detection, dissemination and anti-entropy for one replica.

The node owns four loops, all started by ``start`` and cancelled by ``stop``:

- gossip round (every ``gossip_interval``): hand local deltas and load to the queues, then
  send Rumours (membership, load reports, offers of delta ids) to ``fanout`` random peers and
  push the delta bodies each peer asks for;
- probe (every ``probe_interval``): SWIM ping, indirect ping, suspect; expire suspicions,
  forget the long dead, drop load reports past their TTL;
- push-pull (every ``push_pull_interval``; anti-entropy, ``router.gossip.anti_entropy``):
  exchange membership and digests with one random peer and repair both sides, and try one
  member declared dead (it may only have been cut off); a peer too far behind is advised to
  fetch a snapshot;
- rejoin (every ``rejoin_interval``): resolve seeds and the DNS name, push-pull with
  addresses no live member has.

Every exchange it starts is bounded by a timeout and owned (cancelled on stop); a slow peer
holds at most one of them at a time. The node moves messages and owns time and tasks; what they
change is decided by its ``NodeState`` (state.py), how they are sealed by its ``EnvelopeCodec``
(envelope.py), the push-pull and snapshot exchanges by its ``AntiEntropy`` (anti_entropy.py), and
what a delta or a load figure means by the delegate.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from router.core.fields import ConfigError
from router.gossip.anti_entropy import AntiEntropy
from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.clock import Clock, SystemClock
from router.gossip.config import WILDCARD_HOSTS, GossipConfig, split_hostport
from router.gossip.delegate import Delegate
from router.gossip.discovery import Discovery, Resolver, system_resolver
from router.gossip.envelope import EnvelopeCodec, body_of
from router.gossip.membership import Member, State
from router.gossip.skew import SkewWatch
from router.gossip.state import NodeState
from router.gossip.stats import Counters, GossipStats
from router.gossip.transport import PeerRefused, Refused, Transport, TransportError
from router.gossip.wire import pb

log = logging.getLogger(__name__)

# Addresses contacted per rejoin tick, so a DNS name with many stale entries stays cheap.
JOIN_BATCH = 8

BodyHandler = Callable[[Any], Awaitable[tuple[str, Any]]]


class GossipNode:
    """One replica's gossip endpoint; ``start``/``stop`` own everything it runs."""

    def __init__(
        self,
        config: GossipConfig,
        delegate: Delegate,
        transport: Transport,
        *,
        clock: Clock | None = None,
        resolver: Resolver | None = None,
        seed: int | None = None,
    ) -> None:
        t = config.tuning
        self.config = config
        self.tuning = t
        self.node_id = config.node_id
        self.address = ""
        self._transport = transport
        self._clock: Clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._discovery = Discovery(config.seeds, config.dns_target, resolver or system_resolver)
        self._counters = Counters()
        self._envelopes = EnvelopeCodec(
            self.node_id,
            Sealer(config.secret),
            ReplayGuard.create(t.replay_window, t.replay_entries),
            t.max_message_bytes,
            self._counters,
        )
        self._state = NodeState(self.node_id, t, delegate, self._counters)
        self._anti_entropy = AntiEntropy(
            self._state,
            delegate,
            self._clock,
            self._counters,
            self._rng,
            exchange=self._exchange,
            call=self._call,
            spawn=self._spawn,
        )
        self._skew = SkewWatch(t.replay_window, t.max_members)
        self._loops: list[asyncio.Task[None]] = []
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self._handlers: dict[str, BodyHandler] = {
            "ping": self._on_ping,
            "indirect_ping": self._on_indirect_ping,
            "rumours": self._on_rumours,
            "updates": self._on_updates,
            "push_pull": self._anti_entropy.on_push_pull,
            "snapshot_request": self._anti_entropy.on_snapshot_request,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen and start the loops; joining the seeds and DNS peers begins at once."""
        if self._running:
            raise RuntimeError(f"gossip node {self.node_id} already started")
        bound = await self._transport.start(self._handle)
        self.address = self.config.advertise or bound
        host = split_hostport(self.address, "advertise")[0]
        if host in WILDCARD_HOSTS:
            await self._transport.stop()
            raise ConfigError(f"gossip bound {bound!r} on a wildcard: set advertise")
        self._envelopes.listening(self.address, bound)
        self._state.start(self.address, self._clock.now(), self._clock.wall())
        self._running = True
        t = self.tuning
        # Joining runs in the background (as the rejoin loop's first step), so that start
        # never waits on unreachable seeds; ``join`` is there for callers who want to wait.
        self._loops = [
            self._loop("rejoin", t.rejoin_interval, self._rejoin, phase=0.0),
            self._loop("gossip", t.gossip_interval, self._round),
            self._loop("probe", t.probe_interval, self._probe),
            self._loop("push-pull", t.push_pull_interval, self._anti_entropy.round),
        ]

    async def stop(self, leave: bool = True) -> None:
        """Announce leaving (when ``leave``), cancel every task, close the transport."""
        if not self._running:
            return
        if leave:
            await self._leave()
        self._running = False
        tasks = [*self._loops, *self._inflight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops.clear()
        self._inflight.clear()
        await self._transport.stop()

    async def join(self, addresses: Iterable[str] | None = None) -> int:
        """Push-pull with ``addresses`` (default: what seeds and DNS give); how many answered."""
        if addresses is None:
            addresses = await self._discovery.addresses()
        targets = [a for a in dict.fromkeys(addresses) if a != self.address][: JOIN_BATCH * 4]
        results = await asyncio.gather(*(self._anti_entropy.push_pull(a) for a in targets))
        return sum(results)

    # -- public views --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Between ``start`` and ``stop``."""
        return self._running

    def members(self) -> list[Member]:
        """Every member this node knows, itself included."""
        return self._state.members.all()

    def stats(self) -> GossipStats:
        """Counters and gauges right now."""
        return self._state.stats()

    # -- loops ---------------------------------------------------------------------------------

    def _loop(
        self,
        name: str,
        interval: float,
        step: Callable[[], Awaitable[None]],
        phase: float | None = None,
    ) -> asyncio.Task[None]:
        # A random phase keeps replicas started together from acting in lockstep.
        delay = self._rng.uniform(0, interval) if phase is None else phase

        async def run() -> None:
            await self._clock.sleep(delay)
            while True:
                started = self._clock.now()
                try:
                    await step()
                except Exception:
                    self._counters.errors += 1
                    log.exception("gossip %s loop of %s failed", name, self.node_id)
                await self._clock.sleep(started + interval - self._clock.now())

        return asyncio.create_task(run(), name=f"gossip-{name}-{self.node_id}")

    def _can_spawn(self, key: str) -> bool:
        return key not in self._inflight and len(self._inflight) < self.tuning.max_inflight

    def _spawn(self, key: str, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` as an owned task, at most one per ``key`` and ``max_inflight`` in all."""
        if not self._can_spawn(key):
            coro.close()
            return False
        task = asyncio.create_task(coro, name=f"gossip-{key}-{self.node_id}")
        self._inflight[key] = task
        task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return True

    async def _round(self) -> None:
        self._state.take_local(self._clock.now(), self._clock.wall())
        table = self._state.members
        # A peer still busy with the last exchange is skipped: a slow peer holds one task.
        peers = [p for p in table.peers(State.ALIVE, State.SUSPECT) if self._can_spawn(p.address)]
        if not peers:
            return
        self._counters.rounds += 1
        limit = self.tuning.retransmit_limit(table.live_count())
        for peer in self._rng.sample(peers, min(self.tuning.fanout, len(peers))):
            if not self._can_spawn(peer.address):
                break
            rumours = self._state.rumours(limit)
            if rumours is None:
                break
            self._spawn(peer.address, self._send_rumours(peer, rumours))

    async def _probe(self) -> None:
        t, table = self.tuning, self._state.members
        self._state.expire(self._clock.now())
        target = table.next_probe(self._rng)
        if target is None:
            return
        self._counters.probes += 1
        if await self._ping(target.address, target.id, t.probe_timeout):
            return
        helpers = [p for p in table.peers(State.ALIVE) if p.id != target.id]
        helpers = self._rng.sample(helpers, min(t.indirect_checks, len(helpers)))
        window = t.probe_interval - t.probe_timeout
        reached = await asyncio.gather(*(self._indirect(h, target, window) for h in helpers))
        if any(reached):
            return
        self._counters.probe_failures += 1
        self._state.suspect(target, self._clock.now())

    async def _rejoin(self) -> None:
        table = self._state.members
        found = await self._discovery.addresses()
        fresh = [a for a in found if a != self.address and not table.address_known(a)]
        if fresh:
            self._rng.shuffle(fresh)
            await self.join(fresh[:JOIN_BATCH])

    # -- outgoing exchanges --------------------------------------------------------------------

    # Timeouts go to the transport (a gRPC deadline, or the virtual clock), not asyncio.timeout.
    async def _exchange(
        self,
        address: str,
        node_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
        **body: Any,
    ) -> pb.Frame | None:
        """One authenticated exchange with member ``node_id`` at ``address`` (a first contact
        when ``node_id`` is empty); the reply frame, or None on any failure or a nack."""
        request = self._envelopes.request(self._clock.wall(), node_id, address, **body)
        payload = self._envelopes.seal(request)
        try:
            raw = await self._transport.call(address, payload, timeout or self.tuning.call_timeout)
        except PeerRefused as e:
            # Unlike a failed call, a refusal is no network fault: say so, now and then.
            self._counters.call_failures += 1
            if self._skew.due(f"refused by {address}", self._clock.now()):
                log.warning("gossip: a message from %s was refused (%s)", self.node_id, e)
            return None
        except TransportError as e:
            self._counters.call_failures += 1
            log.debug("gossip call from %s to %s failed: %s", self.node_id, address, e)
            return None
        reply = self._envelopes.answer(raw, request)
        if reply is not None:
            self._clock_skew(reply.sender, reply.sent_unix_ms / 1000 - self._clock.wall())
        return reply

    async def _call(
        self,
        address: str,
        node_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
        **body: Any,
    ) -> Any:
        """``_exchange``, for the reply's body message (or None)."""
        reply = await self._exchange(address, node_id, timeout, **body)
        return None if reply is None else body_of(reply)

    async def _ping(self, address: str, target_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        ping = pb.Ping(target_id=target_id, members=self._state.piggyback())
        ack = await self._call(address, target_id, timeout, ping=ping)
        if not isinstance(ack, pb.Ack):
            return False
        self._state.merge_members(ack.members, self._clock.now())
        return True

    async def _indirect(self, helper: Member, target: Member, timeout: float) -> bool:  # noqa: ASYNC109
        req = pb.IndirectPing(target_id=target.id, target_address=target.address)
        reply = await self._call(helper.address, helper.id, timeout, indirect_ping=req)
        return isinstance(reply, pb.IndirectAck) and reply.reached

    async def _send_rumours(self, peer: Member, rumours: pb.Rumours) -> None:
        reply = await self._call(peer.address, peer.id, rumours=rumours)
        if not isinstance(reply, pb.RumoursReply):
            return
        bodies = self._state.apply_rumours_reply(reply, self._clock.now())
        if bodies:
            await self._call(peer.address, peer.id, updates=pb.Updates(deltas=bodies))

    async def _leave(self) -> None:
        me = self._state.leave(self._clock.now())
        peers = self._state.members.peers(State.ALIVE, State.SUSPECT)
        chosen = self._rng.sample(peers, min(self.tuning.fanout, len(peers)))
        rumours = pb.Rumours(members=[me])
        await asyncio.gather(*(self._call(p.address, p.id, rumours=rumours) for p in chosen))

    # -- serving -------------------------------------------------------------------------------

    def _clock_skew(self, peer: str, skew: float) -> None:
        line = self._skew.observe(peer, skew, self._clock.now())
        if line is not None:
            log.warning("%s (seen by %s)", line, self.node_id)

    async def _handle(self, payload: bytes) -> bytes:
        wall = self._clock.wall()
        try:
            frame = self._envelopes.accept(payload, wall)
        except AuthError as e:
            if e.skew is not None:
                self._clock_skew(e.sender, e.skew)
            raise Refused(str(e)) from e
        self._clock_skew(frame.sender, frame.sent_unix_ms / 1000 - wall)
        kind = frame.WhichOneof("body")
        handler = self._handlers.get(kind or "")
        if not self._running or handler is None or frame.sender == self.node_id:
            reply_kind, body = "nack", pb.Nack(reason=f"cannot serve {kind}")
        else:
            try:
                reply_kind, body = await handler(getattr(frame, kind or ""))
                sender = self._state.members.get(frame.sender)
                if sender is not None:
                    self._anti_entropy.repair_skipped(sender.address, sender.id)
            except Exception:
                # A delegate that fails on one message must not take the server down with it.
                self._counters.errors += 1
                log.exception(
                    "gossip %s failed to serve %s from %s", self.node_id, kind, frame.sender
                )
                reply_kind, body = "nack", pb.Nack(reason="internal error")
        reply = self._envelopes.reply(frame, self._clock.wall(), **{reply_kind: body})
        return self._envelopes.seal(reply)

    async def _on_ping(self, ping: pb.Ping) -> tuple[str, Any]:
        if ping.target_id and ping.target_id != self.node_id:
            return "nack", pb.Nack(reason=f"this is {self.node_id}, not {ping.target_id}")
        self._state.merge_members(ping.members, self._clock.now())
        return "ack", pb.Ack(members=self._state.piggyback())

    async def _on_indirect_ping(self, req: pb.IndirectPing) -> tuple[str, Any]:
        if not req.target_address:
            return "nack", pb.Nack(reason="indirect ping without a target address")
        window = self.tuning.probe_interval - self.tuning.probe_timeout
        reached = await self._ping(req.target_address, req.target_id, 0.8 * window)
        return "indirect_ack", pb.IndirectAck(reached=reached)

    async def _on_rumours(self, rumours: pb.Rumours) -> tuple[str, Any]:
        return "rumours_reply", self._state.answer_rumours(rumours, self._clock.now())

    async def _on_updates(self, updates: pb.Updates) -> tuple[str, Any]:
        self._state.apply_updates(updates, self._clock.now(), self._clock.wall())
        return "ack", pb.Ack()
