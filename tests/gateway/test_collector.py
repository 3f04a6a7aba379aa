"""The collector as the gateway sets it: start-up frozen, the young collected less often, and
garbage cycles still collected without anyone asking."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from router.gateway.runtime import collector


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def settled() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        collector.settle()
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_settle_freezes_start_up_and_raises_the_young_threshold(settled: None) -> None:
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == collector.YOUNG_THRESHOLD


def test_cycles_made_after_start_up_are_still_collected(settled: None) -> None:
    probe = weakref.ref(Node())
    # Enough tracked allocations to pass the young threshold a few times over.
    keep: list[list[int]] = [[] for _ in range(collector.YOUNG_THRESHOLD * 3)]
    assert probe() is None
    assert len(keep) == collector.YOUNG_THRESHOLD * 3
