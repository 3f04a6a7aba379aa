"""Which implementation runs the decision's hot loops: the compiled one, or the reference.

The extension module ``_hotpath`` next to this one (C, ``router/core/hotpath-c/hotpath.c``) does
the per-block and per-engine loops of a decision: the chained block hashes (``core.blocks``),
the longest-prefix walk per engine (``core.index``), the LRU sets of block keys themselves
(``core.lru``, a compiled type), the claims (``core.predictions``), the shortlist's passes and
narrowing (``core.shortlist``), the bounded-load cap (``core.ring``), the scorers' per-candidate
arithmetic and the weighted totals (``core.scorers``) and the ranking of the fallbacks
(``core.pickers``); and, outside the decision, the trace spans' OTLP encoding
(``router.gateway.tracing.otlp``). Each of those modules keeps its pure-Python loop as the
reference: property tests hold the two to identical results, and it runs wherever the extension
is missing (no C compiler at install time: a warning says so once) or unwanted
(``KVROUTER_PURE_PYTHON=1`` in the environment), and for figures the compiled code does not
compute exactly in 64 bits (it raises, and the caller runs the reference).

Callers read ``native`` at call time, never bind it at import, so that setting it to None (what
the tests do to run the reference) switches every caller at once.
"""

from __future__ import annotations

import os
import warnings
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from router.core.lru import Lru

# Set to 1 to run the pure-Python reference although the compiled extension is installed.
PURE_PYTHON_VARIABLE = "KVROUTER_PURE_PYTHON"


class CompiledMissingWarning(RuntimeWarning):
    """The compiled extension is not installed: decisions run the pure-Python reference."""


class Native(Protocol):
    """What the compiled module offers (its stub, ``_hotpath.pyi``, is checked against this)."""

    def chain(
        self, data: bytes | memoryview | array[int], size: int, seed: int, /
    ) -> list[int]: ...
    def text_chain(self, text: str, size: int, seed: int, /) -> list[int]: ...
    def overlaps(
        self,
        tables: Mapping[str, object],
        engines: Sequence[str],
        keys: Sequence[int],
        now: float | None,
        ttls: dict[str, float],
        /,
    ) -> list[int]: ...
    def Lru(self, capacity: int, ttl: float | None, /) -> Lru: ...  # a class: the compiled LRU set
    def discard(self, table: dict[int, Any], keys: Iterable[int], /) -> list[int]: ...
    def claim(self, counts: dict[int, int], keys: Iterable[int], /) -> None: ...
    def withdraw(self, counts: dict[int, int], keys: Iterable[int], /) -> list[int]: ...
    def shortlist(
        self,
        overlaps: Sequence[int],
        requests: Sequence[int],
        eligible: Sequence[bool],
        holders: int,
        spares: int,
        /,
    ) -> tuple[list[int], bool]: ...
    def narrow(
        self, keep: list[int], cands: list[str], columns: tuple[list[Any], ...], /
    ) -> tuple[list[str], tuple[list[Any], ...]]: ...
    def under_cap(
        self, loads: Sequence[int], weight: int, epsilon: float, min_cap: int, /
    ) -> list[bool]: ...
    def ttft_costs(
        self,
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
    def falling(self, costs: Sequence[float], /) -> list[float]: ...
    def shares(
        self, overlaps: Sequence[int], blocks: int, waiting: Sequence[int], /
    ) -> list[float]: ...
    def weighted(
        self, weights: Sequence[float], columns: Sequence[list[float]], n: int, /
    ) -> list[float]: ...
    def rank(
        self, eligible: Sequence[bool], totals: Sequence[float], requests: Sequence[int], /
    ) -> list[int]: ...
    def otlp_spans(self, spans: Sequence[Any], /) -> bytes: ...


def _load() -> Native | None:
    if os.environ.get(PURE_PYTHON_VARIABLE, "") not in {"", "0"}:
        return None
    try:
        from router.core import _hotpath  # optional: absent where it could not be compiled
    except ImportError as exc:
        warnings.warn(
            f"kvrouter's compiled decision code is not installed ({exc}); running the pure-Python"
            " code, slower on large fleets. Reinstall kvrouter where a C compiler and the Python"
            " headers exist (e.g. `apt-get install gcc python3-dev`, then `pip install"
            f" --force-reinstall --no-deps kvrouter`); set {PURE_PYTHON_VARIABLE}=1 to silence"
            " this.",
            CompiledMissingWarning,
            stacklevel=2,
        )
        return None
    return _hotpath


# The compiled module, or None where the pure-Python reference runs.
native: Native | None = _load()


def compiled() -> bool:
    """Whether the compiled extension runs the hot loops in this process."""
    return native is not None
