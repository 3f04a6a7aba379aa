"""Frames in and out of envelopes: what a node puts on the wire, what it accepts, what it refuses.

Every message is a ``pb.Frame`` serialized into a ``pb.Envelope`` beside the MAC of those bytes
(``auth.Sealer``), and every frame names its recipient under that MAC: a request the node id of
the member it is for, or, on a first contact, the address dialled; a reply the requester's id.
A request is accepted only when it is within the size limit, its MAC verifies, it speaks this
protocol version, it is for this node (``Recipients``), and its (sender, nonce) is fresh inside
the replay window (``auth.ReplayGuard``); a reply only when it also answers the nonce of the
request it came back for, is for this node, and comes from the node the request was for. Each
refusal is counted under its reason, and every envelope sealed or opened under messages and
bytes. No I/O: the node moves the bytes and passes the wall clock in.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from router import hostport
from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.config import WILDCARD_HOSTS
from router.gossip.stats import Counters
from router.gossip.wire import PROTOCOL_VERSION, pb


def canonical_address(address: str) -> str:
    """``address`` as addresses are compared: host lower-cased, an IP literal canonical."""
    try:
        host, port = hostport.split(address, port_zero=True)
    except ValueError:
        return address
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        host = host.lower().rstrip(".")
    return hostport.join(host, port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Recipients:
    """What a request may name as its recipient to be accepted by this node."""

    node_id: str
    # Canonical addresses this node is dialled at: the advertised one and the one bound.
    addresses: frozenset[str] = frozenset()
    # When bound on every interface: its port, at which any loopback address is this node too
    # (processes on one host dial each other on loopback).
    loopback_port: int | None = None

    @classmethod
    def listening(cls, node_id: str, advertised: str, bound: str) -> Recipients:
        """The recipients of a node advertising ``advertised`` with its listener on ``bound``."""
        host, port = hostport.split(bound, port_zero=True)
        addresses = frozenset(canonical_address(a) for a in (advertised, bound))
        return cls(node_id, addresses, port if host in WILDCARD_HOSTS else None)

    def accepts(self, frame: pb.Frame) -> bool:
        """Whether ``frame`` names this node as its recipient."""
        kind = frame.WhichOneof("recipient")
        if kind == "recipient_id":
            return frame.recipient_id == self.node_id
        if kind != "recipient_address":
            return False
        address = canonical_address(frame.recipient_address)
        if address in self.addresses:
            return True
        if self.loopback_port is None:
            return False
        try:
            host, port = hostport.split(address, port_zero=True)
        except ValueError:
            return False
        return port == self.loopback_port and _is_loopback(host)


class EnvelopeCodec:
    """Seals this node's frames and opens its peers', counting traffic and refusals."""

    def __init__(
        self,
        node_id: str,
        sealer: Sealer,
        replay: ReplayGuard,
        max_bytes: int,
        counters: Counters,
    ) -> None:
        self.node_id = node_id
        self.max_bytes = max_bytes
        # Until the node listens, only requests naming its id are for it.
        self.recipients = Recipients(node_id)
        self._sealer = sealer
        self._replay = replay
        self._counters = counters

    def listening(self, advertised: str, bound: str) -> None:
        """Accept requests for these addresses too (first contacts), from now on."""
        self.recipients = Recipients.listening(self.node_id, advertised, bound)

    def request(self, wall: float, node_id: str, address: str, **body: Any) -> pb.Frame:
        """A request carrying ``body`` for member ``node_id``, or, when its id is not known
        (empty), for whoever listens at ``address``; sent at ``wall``, with a fresh nonce."""
        if node_id:
            return self._frame(wall, recipient_id=node_id, **body)
        if not address:
            raise ValueError("a request needs a recipient: a node id or an address")
        return self._frame(wall, recipient_address=address, **body)

    def reply(self, request: pb.Frame, wall: float, **body: Any) -> pb.Frame:
        """The reply carrying ``body`` to ``request``: for its sender, answering its nonce."""
        return self._frame(wall, recipient_id=request.sender, reply_to=request.nonce, **body)

    def _frame(self, wall: float, **fields: Any) -> pb.Frame:
        return pb.Frame(
            version=PROTOCOL_VERSION,
            sender=self.node_id,
            sent_unix_ms=int(wall * 1000),
            nonce=secrets.randbits(64) or 1,
            **fields,
        )

    def seal(self, frame: pb.Frame) -> bytes:
        """``frame`` in its envelope, MAC included, counted as sent."""
        data = frame.SerializeToString()
        envelope: bytes = pb.Envelope(frame=data, mac=self._sealer.mac(data)).SerializeToString()
        self._counters.messages_out += 1
        self._counters.bytes_out += len(envelope)
        return envelope

    def open(self, payload: bytes) -> pb.Frame:
        """The frame inside ``payload``; AuthError when it is forged, garbled or foreign."""
        try:
            envelope = pb.Envelope.FromString(payload)
            self._sealer.verify(envelope.frame, envelope.mac)
            frame: pb.Frame = pb.Frame.FromString(envelope.frame)
        except DecodeError as e:
            raise AuthError("malformed", f"undecodable message: {e}") from e
        if frame.version != PROTOCOL_VERSION:
            version = f"protocol version {frame.version}"
            raise AuthError("malformed", f"{version} not spoken (only {PROTOCOL_VERSION})")
        return frame

    def accept(self, payload: bytes, wall: float) -> pb.Frame:
        """A request's frame, received at ``wall``; AuthError, counted, when it is refused."""
        self._received(payload)
        try:
            if len(payload) > self.max_bytes:
                raise AuthError("malformed", f"{len(payload)} bytes exceed the message limit")
            frame = self.open(payload)
            # Before the replay check: a frame for another node takes no room in its memory.
            if not self.recipients.accepts(frame):
                raise AuthError("recipient", self._misdirected(frame))
            self._replay.check(frame.sender, frame.nonce, frame.sent_unix_ms / 1000, wall)
        except AuthError as e:
            self._count_refusal(e)
            raise
        return frame

    def answer(self, payload: bytes, request: pb.Frame) -> pb.Frame | None:
        """The reply to ``request`` in ``payload``; None when refused (counted) or a nack."""
        self._received(payload)
        try:
            reply = self.open(payload)
        except AuthError as e:
            self._count_refusal(e)
            return None
        if reply.reply_to != request.nonce:
            self._counters.refused_replay += 1
            return None
        wanted = request.recipient_id
        if reply.recipient_id != self.node_id or (wanted and reply.sender != wanted):
            self._counters.refused_recipient += 1
            return None
        if reply.WhichOneof("body") in ("nack", None):
            return None
        return reply

    def _misdirected(self, frame: pb.Frame) -> str:
        kind = frame.WhichOneof("recipient")
        if kind is None:
            return f"frame from {frame.sender!r} names no recipient"
        named = f"{kind.removeprefix('recipient_')} {getattr(frame, kind)!r}"
        return f"frame from {frame.sender!r} is for {named}, this is {self.node_id!r}"

    def _count_refusal(self, e: AuthError) -> None:
        c = self._counters
        if e.reason == "mac":
            c.refused_mac += 1
        elif e.reason == "replay":
            c.refused_replay += 1
        elif e.reason == "stale":
            c.refused_stale += 1
        elif e.reason == "recipient":
            c.refused_recipient += 1
        else:
            c.refused_malformed += 1

    def _received(self, payload: bytes) -> None:
        self._counters.messages_in += 1
        self._counters.bytes_in += len(payload)


def body_of(frame: pb.Frame) -> Any:
    """The message in ``frame``'s body (None when it has none)."""
    kind = frame.WhichOneof("body")
    return None if kind is None else getattr(frame, kind)
