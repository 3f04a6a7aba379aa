"""Who may speak: the shared-secret MAC on every envelope, and the replay window.

A frame is accepted only when (1) its envelope's MAC verifies under the shared secret (checked
before the frame is parsed, so an outsider cannot reach the parser), and (2) its timestamp is
inside the replay window and its (sender, nonce) has not been seen in that window. Under mutual
TLS the channel authenticates the peer, and the MAC is checked only when a secret is set too.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import deque
from dataclasses import dataclass

# Domain separation: a MAC made for this protocol (the proto package) is useless anywhere else;
# its versions are told apart by the version inside the MAC'ed frame.
MAC_CONTEXT = b"kvrouter.gossip.v1\0"


class AuthError(Exception):
    """A frame was refused; ``reason`` is its metric label (mac, malformed, recipient, stale,
    replay)."""

    def __init__(
        self, reason: str, detail: str, *, sender: str = "", skew: float | None = None
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        # For a stale frame: who sent it (its MAC verified) and how far its clock seems off.
        self.sender = sender
        self.skew = skew


class Sealer:
    """HMAC-SHA256 over frames with the fleet's shared secret (a no-op without one)."""

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def mac(self, frame: bytes) -> bytes:
        """The MAC to send with ``frame`` (empty without a secret)."""
        if self._secret is None:
            return b""
        return hmac.new(self._secret, MAC_CONTEXT + frame, hashlib.sha256).digest()

    def verify(self, frame: bytes, mac: bytes) -> None:
        """Raise AuthError unless ``mac`` is the MAC of ``frame``."""
        if self._secret is None:
            return
        if not hmac.compare_digest(self.mac(frame), mac):
            raise AuthError("mac", "message authentication code does not verify")


@dataclass(slots=True)
class ReplayGuard:
    """Refuses frames outside the time window or with a (sender, nonce) seen in it.

    Bounded: past ``max_entries`` the oldest entries are forgotten and every frame sent at or
    before the newest forgotten one is refused, so a forgotten nonce can never be replayed.
    """

    window: float
    max_entries: int
    _seen: dict[tuple[str, int], float]
    _order: deque[tuple[float, tuple[str, int]]]
    _floor: float

    @classmethod
    def create(cls, window: float, max_entries: int) -> ReplayGuard:
        return cls(window, max_entries, {}, deque(), float("-inf"))

    def check(self, sender: str, nonce: int, sent: float, now: float) -> None:
        """Record the frame or raise AuthError (``stale`` or ``replay``)."""
        if abs(now - sent) > self.window:
            detail = f"frame stamped {sent - now:+.1f}s from the recipient's clock, beyond"
            raise AuthError(
                "stale", f"{detail} the {self.window:g}s window", sender=sender, skew=sent - now
            )
        if sent <= self._floor:
            raise AuthError("replay", "frame older than the replay memory")
        key = (sender, nonce)
        if key in self._seen:
            raise AuthError("replay", f"nonce {nonce:#x} from {sender!r} seen before")
        self._expire(now)
        self._seen[key] = sent
        self._order.append((sent, key))
        while len(self._seen) > self.max_entries:
            old_sent, old_key = self._order.popleft()
            if self._seen.pop(old_key, None) is not None:
                self._floor = max(self._floor, old_sent)

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        horizon = now - self.window
        order, seen = self._order, self._seen
        while order and order[0][0] < horizon:
            seen.pop(order.popleft()[1], None)
