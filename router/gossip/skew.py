"""Clocks that disagree: how far each peer's is from this node's, and when the log says so.

One thing in gossip compares clocks across replicas: the replay window
(``auth.ReplayGuard``), which refuses a frame whose timestamp is more than ``replay_window``
from this node's wall clock. It must: a window that followed a peer's clock would let frames
captured from a peer minutes behind be replayed for minutes, and let a peer minutes ahead
stamp frames that stay fresh that long. So a peer whose clock is off by more than the
window is refused, both ways (its frames look stale here, ours there), until the clocks
agree. Everything else that ages is a duration on one replica's own monotonic clock
(suspicion, load report TTL, index TTL, asks for delta bodies, snapshot sessions), and load
report versions are compared only with the same replica's own, so any skew inside the window
is tolerated. (Only ``kvrouter_gossip_convergence_lag_seconds`` reads two clocks: it is off
by the skew, and a lag cannot be negative.)

``SkewWatch`` takes the skew of every authenticated frame (its timestamp minus this node's
wall clock at arrival, the network's delay included) and says when it deserves a log line:
a refused peer at once, a tolerated one past a third of the window (a warning before the
refusals start), then again only when that changes or after ``every`` seconds. It also
rate-limits the lines about peers refusing this node. Bounded in peers; no I/O: the node
logs what it returns.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

# A tolerated skew is worth a warning past this share of the replay window.
WARN_SHARE = 1 / 3
# A log line about one peer at most this often, while nothing changes.
EVERY_SECONDS = 60.0

_V = TypeVar("_V")


class SkewWatch:
    """Each peer's last skew, and whether a line about it is due."""

    def __init__(self, window: float, max_peers: int, every: float = EVERY_SECONDS) -> None:
        self.window = window
        self.warn_above = window * WARN_SHARE
        self.every = every
        self.max_peers = max_peers
        self.skews: OrderedDict[str, float] = OrderedDict()
        # Per peer (or key), when its last line was logged and what it said (refused or not).
        self._logged: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    def observe(self, peer: str, skew: float, now: float) -> str | None:
        """Record that ``peer``'s frame was ``skew`` seconds ahead of this clock (negative:
        behind), seen at monotonic ``now``; the line to log, if one is due."""
        self._remember(self.skews, peer, skew)
        refused = abs(skew) > self.window
        if not refused and abs(skew) <= self.warn_above:
            return None
        if not self.due(peer, now, refused):
            return None
        if refused:
            return (
                f"gossip: refusing {peer}: its clock is {skew:+.1f}s from this replica's, "
                f"beyond the {self.window:g}s replay window; synchronise the replicas' clocks "
                "(NTP)"
            )
        return (
            f"gossip: {peer}'s clock is {skew:+.1f}s from this replica's; tolerated, but "
            f"its messages are refused beyond {self.window:g}s"
        )

    def due(self, key: str, now: float, kind: bool = True) -> bool:
        """Whether a line about ``key`` may be logged at ``now`` (it is then counted as logged):
        the first, one of another ``kind``, or one ``every`` seconds after the last."""
        last = self._logged.get(key)
        if last is not None and last[1] == kind and now - last[0] < self.every:
            return False
        self._remember(self._logged, key, (now, kind))
        return True

    def _remember(self, table: OrderedDict[str, _V], key: str, value: _V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.max_peers:
            table.popitem(last=False)
