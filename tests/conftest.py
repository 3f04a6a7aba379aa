"""Fixtures: ``procs`` collects processes a test starts and stops them all afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Proc


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            p.stop()
