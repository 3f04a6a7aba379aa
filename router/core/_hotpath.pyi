# The compiled router.core._hotpath (router/core/hotpath-c/hotpath.c); see router.core.hotpath.
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.core.lru import Lru as _Lru

def chain(data: bytes | memoryview | array[int], size: int, seed: int, /) -> list[int]: ...
def text_chain(text: str, size: int, seed: int, /) -> list[int]: ...
def overlaps(
    tables: Mapping[str, object],
    engines: Sequence[str],
    keys: Sequence[int],
    now: float | None,
    ttls: dict[str, float],
    /,
) -> list[int]: ...
def discard(table: dict[int, Any], keys: Iterable[int], /) -> list[int]: ...
def claim(counts: dict[int, int], keys: Iterable[int], /) -> None: ...
def withdraw(counts: dict[int, int], keys: Iterable[int], /) -> list[int]: ...
def shortlist(
    overlaps: Sequence[int],
    requests: Sequence[int],
    eligible: Sequence[bool],
    holders: int,
    spares: int,
    /,
) -> tuple[list[int], bool]: ...
def narrow(
    keep: list[int], cands: list[str], columns: tuple[list[Any], ...], /
) -> tuple[list[str], tuple[list[Any], ...]]: ...
def under_cap(loads: Sequence[int], weight: int, epsilon: float, min_cap: int, /) -> list[bool]: ...
def ttft_costs(
    overlaps: Sequence[int],
    tokens: Sequence[int],
    requests: Sequence[int],
    waiting: Sequence[int],
    usage: Sequence[float],
    prompt_tokens: int,
    block_tokens: int,
    wait_tokens: int,
    running_tokens: int,
    kv_pressure: float,
    /,
) -> list[float]: ...
def falling(costs: Sequence[float], /) -> list[float]: ...
def shares(overlaps: Sequence[int], blocks: int, waiting: Sequence[int], /) -> list[float]: ...
def weighted(
    weights: Sequence[float], columns: Sequence[list[float]], n: int, /
) -> list[float]: ...
def rank(
    eligible: Sequence[bool], totals: Sequence[float], requests: Sequence[int], /
) -> list[int]: ...
def otlp_spans(spans: Sequence[Any], /) -> bytes: ...

# A class at run time; typed as what it makes, the face router.core.lru.Lru describes.
def Lru(capacity: int, ttl: float | None = None) -> _Lru: ...
