"""What this node holds of the versioned traffic: delta ids, recent delta bodies, load reports.

``DeltaStore`` knows, per origin, which sequence numbers arrived (a ``SeqWindow``), keeps the
most recent bodies (bounded in bytes and per origin) to repair peers, and can say what a peer's
digest lacks and whether deltas alone can repair it, and whether its own windows had to pass
deltas that never came (then only a snapshot repairs it). ``LoadStore`` keeps each origin's newest
load report. Neither interprets a delta's contents: that is the delegate's job.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from router.core.seq import SeqWindow
from router.gossip.wire import pb


@dataclass(frozen=True, slots=True)
class Repair:
    """What a peer lacks that this node can send, and whether it needs a snapshot instead."""

    deltas: list[pb.Delta]
    snapshot_advised: bool


class DeltaStore:
    """Seen delta ids per origin, recent bodies for repair, and the lag of each origin."""

    def __init__(self, retained_bytes: int, per_origin: int, max_origins: int) -> None:
        self.retained_bytes_limit = retained_bytes
        self.per_origin = per_origin
        self.max_origins = max_origins
        self._windows: OrderedDict[str, SeqWindow] = OrderedDict()
        self._bodies: dict[str, dict[int, tuple[pb.Delta, int]]] = {}
        self._order: deque[tuple[str, int]] = deque()
        self._bytes = 0
        # Seconds between a delta's creation and its arrival, for the newest delta per origin.
        self.lag: dict[str, float] = {}
        self._newest: dict[str, int] = {}
        # Origins whose window passed deltas that never arrived (more waited above a gap than
        # it keeps): its floor now claims them, so no digest shows them missing and only a
        # snapshot can bring what they carried. Cleared by a snapshot.
        self.skipped: set[str] = set()

    @property
    def retained(self) -> int:
        return sum(len(b) for b in self._bodies.values())

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    def has(self, origin: str, seq: int) -> bool:
        w = self._windows.get(origin)
        return w is not None and (seq <= w.floor or seq in w.above)

    def add(self, delta: pb.Delta, wall: float, local: bool = False) -> bool:
        """Record a delta (its id and body); False when it was held already."""
        origin, seq = delta.origin, delta.seq
        window = self._windows.get(origin)
        if window is None:
            window = self._windows[origin] = SeqWindow()
            if len(self._windows) > self.max_origins:
                self._forget(next(iter(self._windows)))
        floor, waiting = window.floor, len(window.above)
        if not window.add(seq):
            return False
        # The floor moves past the numbers seen (those waiting, and this one), or past a gap.
        if window.floor - floor > waiting + 1 - len(window.above):
            self.skipped.add(origin)
        self._windows.move_to_end(origin)
        if not local and seq > self._newest.get(origin, 0):
            self._newest[origin] = seq
            self.lag[origin] = max(0.0, wall - delta.created_unix_ms / 1000)
        self._retain(delta)
        return True

    def get(self, origin: str, seq: int) -> pb.Delta | None:
        entry = self._bodies.get(origin, {}).get(seq)
        return entry[0] if entry is not None else None

    def floors(self) -> dict[str, int]:
        """Per origin, the seq up to which every delta is held."""
        return {o: w.floor for o, w in self._windows.items()}

    def advance(self, floors: Mapping[str, int]) -> None:
        """Count the deltas a restored snapshot covers as held."""
        for origin, floor in floors.items():
            window = self._windows.get(origin)
            if window is None:
                window = self._windows[origin] = SeqWindow()
            window.advance(floor)
        while len(self._windows) > self.max_origins:
            self._forget(next(iter(self._windows)))

    def repair(self, peer_floors: Mapping[str, int], budget: int) -> Repair:
        """The retained deltas a peer with ``peer_floors`` lacks, oldest first, within budget."""
        out: list[pb.Delta] = []
        advised = False
        for origin, window in self._windows.items():
            theirs = peer_floors.get(origin, 0)
            if theirs >= window.floor and not window.above:
                continue
            bodies = self._bodies.get(origin, {})
            wanted = sorted(s for s in bodies if s > theirs)
            # Every seq in (theirs, our floor] must be retained, or deltas cannot catch them up.
            if sum(1 for s in wanted if s <= window.floor) < window.floor - theirs:
                advised = True
            for seq in wanted:
                delta, size = bodies[seq]
                if size > budget:
                    return Repair(out, True)
                budget -= size
                out.append(delta)
        return Repair(out, advised)

    def _retain(self, delta: pb.Delta) -> None:
        size = delta.ByteSize() + 8
        bodies = self._bodies.setdefault(delta.origin, {})
        bodies[delta.seq] = (delta, size)
        self._bytes += size
        self._order.append((delta.origin, delta.seq))
        if len(bodies) > self.per_origin:
            self._drop(delta.origin, min(bodies))
        while self._bytes > self.retained_bytes_limit and self._order:
            origin, seq = self._order.popleft()
            self._drop(origin, seq)
        # Ids dropped per origin stay in the deque; compact it before it outgrows the bodies.
        if len(self._order) > 2 * self.per_origin + 2 * self.retained:
            self._order = deque((o, s) for o, s in self._order if s in self._bodies.get(o, {}))

    def _drop(self, origin: str, seq: int) -> None:
        bodies = self._bodies.get(origin)
        if bodies is None:
            return
        entry = bodies.pop(seq, None)
        if entry is not None:
            self._bytes -= entry[1]
        if not bodies:
            del self._bodies[origin]

    def _forget(self, origin: str) -> None:
        self._windows.pop(origin, None)
        self.skipped.discard(origin)
        self.lag.pop(origin, None)
        self._newest.pop(origin, None)
        for seq in list(self._bodies.get(origin, {})):
            self._drop(origin, seq)


class LoadStore:
    """The newest load report per origin, with the local time it arrived."""

    def __init__(self, max_origins: int) -> None:
        self.max_origins = max_origins
        self._reports: dict[str, tuple[pb.LoadReport, float]] = {}

    def __len__(self) -> int:
        return len(self._reports)

    def offer(self, report: pb.LoadReport, now: float) -> bool:
        """Keep ``report`` if it is newer than the origin's last; True when kept."""
        held = self._reports.get(report.origin)
        if held is not None and held[0].version >= report.version:
            return False
        if held is None and len(self._reports) >= self.max_origins:
            return False
        self._reports[report.origin] = (report, now)
        return True

    def get(self, origin: str) -> pb.LoadReport | None:
        held = self._reports.get(origin)
        return held[0] if held is not None else None

    def forget(self, origin: str) -> bool:
        return self._reports.pop(origin, None) is not None

    def expired(self, now: float, ttl: float, keep: str) -> list[str]:
        """Origins (other than ``keep``) whose report is older than ``ttl``; forgotten."""
        old = [o for o, (_, t) in self._reports.items() if o != keep and now - t > ttl]
        for origin in old:
            del self._reports[origin]
        return old

    def versions(self) -> dict[str, int]:
        return {o: r.version for o, (r, _) in self._reports.items()}

    def newer_than(self, versions: Mapping[str, int]) -> list[pb.LoadReport]:
        return [r for o, (r, _) in self._reports.items() if r.version > versions.get(o, 0)]

    def reports(self) -> Iterable[pb.LoadReport]:
        return (r for r, _ in self._reports.values())
