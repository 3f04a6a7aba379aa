"""The router's gossip delegate: a ``BlockIndex`` and a ``LoadBook`` behind a gossip node.

The gateway calls ``queue(delta)`` with every delta its routing core returns
(``RoutingCore.record``, from ``BlockIndex.confirm``; ``RoutingCore.forget``, from
``BlockIndex.clear``); the node takes them each round. Remote deltas go to ``BlockIndex.apply``
(the index decides how a delta merges), remote load and prefix heat to ``LoadBook.peer_report``,
and a dead or silent peer's load to ``LoadBook.forget_peer``. Local load is read from
``LoadBook.local_all`` and ``LoadBook.hottest`` when the node reports it.

A restarted replica numbers its deltas from 1 again, so its index must use an origin that is
new for every process run: build it with ``BlockIndex(limits, origin=run_origin(node_id))``.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence

from router.core.index import BlockIndex, Delta
from router.core.load import HOT_PREFIXES, Load, LoadBook
from router.gossip.wire import pb

# Bytes a snapshot spends per block key (packed fixed64), for sizing chunks.
_KEY_BYTES = 8
# Room left in a chunk for engine names and framing.
_CHUNK_SLACK = 4096


def run_origin(node_id: str) -> str:
    """A delta origin for this process run of ``node_id`` (unique across restarts)."""
    return f"{node_id}/{secrets.token_hex(4)}"


class IndexDelegate:
    """``BlockIndex`` and ``LoadBook`` behind the gossip node's ``Delegate`` hooks."""

    def __init__(
        self,
        index: BlockIndex | Callable[[], BlockIndex],
        loads: LoadBook,
        *,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_queue: int = 16_384,
    ) -> None:
        # A callable gives the index decisions read *now*: the routing core builds a new one
        # when a policy reload changes the block size, and remote deltas must land in it.
        self._index = index if callable(index) else (lambda: index)
        if self.index.origin == "local":
            raise ValueError(
                "the BlockIndex gossips under origin 'local': give it a per-run origin, "
                "BlockIndex(limits, origin=run_origin(node_id))"
            )
        self.loads = loads
        # ``now`` must be the clock the gateway passes to the index (TTL ages).
        self._now = now
        self._wall = wall
        self._queue: deque[pb.Delta] = deque()
        self._max_queue = max_queue
        self.dropped = 0

    @property
    def index(self) -> BlockIndex:
        return self._index()

    def queue(self, delta: Delta) -> None:
        """Queue a local delta (from confirm or clear) for the next gossip round."""
        if len(self._queue) >= self._max_queue:
            # The node is not draining (stopped, or no event loop time): peers repair the
            # gap from a snapshot later, so the oldest is the one to lose.
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(
            pb.Delta(
                origin=delta.origin,
                seq=delta.seq,
                created_unix_ms=int(self._wall() * 1000),
                engine=delta.engine,
                added=delta.added,
                removed=delta.removed,
                cleared=delta.cleared,
            )
        )

    def __len__(self) -> int:
        return len(self._queue)

    # -- Delegate ------------------------------------------------------------------------------

    def local_deltas(self, limit: int) -> list[pb.Delta]:
        """Up to ``limit`` queued local deltas, oldest first."""
        q = self._queue
        return [q.popleft() for _ in range(min(limit, len(q)))]

    def local_load(self) -> list[pb.EngineLoad]:
        """This replica's in-flight load per engine (engines with none omitted)."""
        return [
            pb.EngineLoad(engine=e, requests=ld.requests, tokens=ld.tokens)
            for e, ld in sorted(self.loads.local_all().items())
        ]

    def merge_delta(self, delta: pb.Delta) -> None:
        """Apply a remote delta to the index."""
        self.index.apply(
            Delta(
                delta.origin,
                delta.seq,
                delta.engine,
                added=tuple(delta.added),
                removed=tuple(delta.removed),
                cleared=delta.cleared,
            ),
            self._now(),
        )

    def local_heat(self) -> list[pb.PrefixHeat]:
        """This replica's hottest prefixes and the requests in flight behind each."""
        hot = self.loads.hottest(HOT_PREFIXES)
        return [pb.PrefixHeat(prefix=k, requests=n) for k, n in sorted(hot.items())]

    def merge_load(
        self, origin: str, engines: Sequence[pb.EngineLoad], prefixes: Sequence[pb.PrefixHeat]
    ) -> None:
        """Replace ``origin``'s figures in the load book."""
        loads = {e.engine: Load(e.requests, e.tokens) for e in engines}
        heat = {h.prefix: h.requests for h in prefixes[:HOT_PREFIXES]}
        self.loads.peer_report(origin, loads, heat)

    def forget_load(self, origin: str) -> None:
        self.loads.forget_peer(origin)

    def export_blocks(self, chunk_bytes: int) -> Iterator[list[pb.EngineBlocks]]:
        """Every engine's keys, least recent first, split into chunks of ~``chunk_bytes``."""
        per_chunk = max(1, (chunk_bytes - _CHUNK_SLACK) // _KEY_BYTES)
        part: list[pb.EngineBlocks] = []
        room = per_chunk
        for engine in self.index.engines:
            keys = self.index.export_keys(engine)
            start = 0
            while start < len(keys) or not keys:
                piece = keys[start : start + room]
                part.append(pb.EngineBlocks(engine=engine, keys=piece))
                start += len(piece)
                room -= len(piece)
                if room <= 0:
                    yield part
                    part, room = [], per_chunk
                if not keys:
                    break
        if part:
            yield part

    def restore_blocks(self, engines: Sequence[pb.EngineBlocks]) -> None:
        """Merge one snapshot chunk into the index."""
        now = self._now()
        for blocks in engines:
            self.index.restore_keys(blocks.engine, list(blocks.keys), now)

    def mark_seen(self, floors: Mapping[str, int]) -> None:
        for origin, seq in floors.items():
            self.index.mark_seen(origin, seq)
