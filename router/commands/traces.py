"""Reading trace files for ``kvrouter simulate`` (JSONL, either supported format)."""

from __future__ import annotations

from pathlib import Path

import orjson

from router.core.workload import TraceFormatError, TraceRequest, parse_record


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Parse a JSONL trace, sorted by arrival; blank lines are skipped, bad ones are errors."""
    p = Path(path)
    out: list[TraceRequest] = []
    try:
        with p.open("rb") as f:
            for n, line in enumerate(f, start=1):
                if limit is not None and len(out) >= limit:
                    break
                if not line.strip():
                    continue
                where = f"{p}:{n}"
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise TraceFormatError(f"{where}: invalid JSON: {e}") from None
                out.append(parse_record(rec, where))
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read: {e.strerror or e}") from None
    out.sort(key=lambda r: r.timestamp)  # stable: equal timestamps keep file order
    return out
