"""Frames in and out of envelopes: what a node puts on the wire, what it accepts, what it refuses.

Every message is a ``pb.Frame`` serialized into a ``pb.Envelope`` beside the MAC of those bytes
(``auth.Sealer``). A request is accepted only when it is within the size limit, its MAC
verifies, it speaks this protocol version, and its (sender, nonce) is fresh inside the replay
window (``auth.ReplayGuard``); a reply only when it also answers the nonce of the request it
came back for. Each refusal is counted under its reason, and every envelope sealed or opened
under messages and bytes. No I/O: the node moves the bytes and passes the wall clock in.
"""

from __future__ import annotations

import secrets
from typing import Any

from google.protobuf.message import DecodeError

from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.stats import Counters
from router.gossip.wire import PROTOCOL_VERSION, pb


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
        self._sealer = sealer
        self._replay = replay
        self._counters = counters

    def frame(self, wall: float, reply_to: int = 0, **body: Any) -> pb.Frame:
        """A frame from this node carrying ``body``, sent at ``wall``, with a fresh nonce."""
        return pb.Frame(
            version=PROTOCOL_VERSION,
            sender=self.node_id,
            sent_unix_ms=int(wall * 1000),
            nonce=secrets.randbits(64) or 1,
            reply_to=reply_to,
            **body,
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
            raise AuthError("malformed", f"protocol version {frame.version} not spoken")
        return frame

    def accept(self, payload: bytes, wall: float) -> pb.Frame:
        """A request's frame, received at ``wall``; AuthError, counted, when it is refused."""
        self._received(payload)
        try:
            if len(payload) > self.max_bytes:
                raise AuthError("malformed", f"{len(payload)} bytes exceed the message limit")
            frame = self.open(payload)
            self._replay.check(frame.sender, frame.nonce, frame.sent_unix_ms / 1000, wall)
        except AuthError as e:
            self._count_refusal(e)
            raise
        return frame

    def reply_body(self, payload: bytes, nonce: int) -> Any:
        """The body of the reply to the request sent with ``nonce``; None if refused or a nack."""
        self._received(payload)
        try:
            reply = self.open(payload)
        except AuthError as e:
            self._count_refusal(e)
            return None
        if reply.reply_to != nonce:
            self._counters.refused_replay += 1
            return None
        kind = reply.WhichOneof("body")
        if kind == "nack" or kind is None:
            return None
        return getattr(reply, kind)

    def _count_refusal(self, e: AuthError) -> None:
        c = self._counters
        if e.reason == "mac":
            c.refused_mac += 1
        elif e.reason == "replay":
            c.refused_replay += 1
        elif e.reason == "stale":
            c.refused_stale += 1
        else:
            c.refused_malformed += 1

    def _received(self, payload: bytes) -> None:
        self._counters.messages_in += 1
        self._counters.bytes_in += len(payload)
