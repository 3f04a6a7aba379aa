"""Snapshots for catch-up: the serving side's bounded sessions.

A snapshot is built once, when a peer asks for chunk 0, and kept as a list of chunks until
the peer has fetched them or the session expires. The digest it covers is taken before the
blocks are copied, so a delta merged while copying is at worst delivered again later
(harmless: deltas are idempotent). At most ``max_sessions`` snapshots exist at once, so peers
that fall behind together cannot multiply the memory a snapshot takes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from router.gossip.wire import pb


@dataclass(slots=True)
class _Session:
    chunks: list[pb.SnapshotChunk]
    expires: float
    served: set[int]


class SnapshotSessions:
    """Snapshots being fetched, by id; bounded in number and lifetime."""

    def __init__(self, max_sessions: int, ttl: float) -> None:
        self.max_sessions = max_sessions
        self.ttl = ttl
        self._sessions: dict[int, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def has_room(self, now: float) -> bool:
        """Whether a new snapshot may be built now (expired sessions are dropped first)."""
        for sid in [s for s, v in self._sessions.items() if v.expires <= now]:
            del self._sessions[sid]
        return len(self._sessions) < self.max_sessions

    def open(
        self,
        covers: pb.Digest,
        loads: list[pb.LoadReport],
        parts: list[list[pb.EngineBlocks]],
        now: float,
    ) -> pb.SnapshotChunk:
        """Store a new snapshot made of ``parts``; return its chunk 0."""
        sid = secrets.randbits(64) or 1
        parts = parts or [[]]
        chunks = [
            pb.SnapshotChunk(snapshot_id=sid, chunk=i, chunks=len(parts), engines=engines)
            for i, engines in enumerate(parts)
        ]
        chunks[0].covers.CopyFrom(covers)
        chunks[0].loads.extend(loads)
        self._sessions[sid] = _Session(chunks, now + self.ttl, set())
        return self.chunk(sid, 0, now) or chunks[0]

    def chunk(self, sid: int, index: int, now: float) -> pb.SnapshotChunk | None:
        """Chunk ``index`` of snapshot ``sid``; None when unknown or expired."""
        session = self._sessions.get(sid)
        if session is None or session.expires <= now or not 0 <= index < len(session.chunks):
            return None
        session.served.add(index)
        if len(session.served) == len(session.chunks):
            del self._sessions[sid]
        return session.chunks[index]
