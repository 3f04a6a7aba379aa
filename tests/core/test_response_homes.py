"""``ResponseHomes``: bounded, least recently used out, and the candidates it narrows to."""

from __future__ import annotations

import pytest

from router.core.response_homes import MAX_ID_CHARS, ResponseHomes


def test_response_homes_remembers_engines_and_forgets_the_least_recently_used() -> None:
    homes = ResponseHomes(capacity=2)
    homes.learn("r1", "a")
    homes.learn("r2", "b")
    assert homes.home("r1") == "a"  # r1 used: r2 is now the oldest
    homes.learn("r3", "a")
    assert len(homes) == 2
    assert homes.home("r2") is None and homes.home("r1") == "a" and homes.home("r3") == "a"


def test_response_homes_candidates_only_the_home_while_it_serves() -> None:
    homes = ResponseHomes()
    homes.learn("r1", "a")
    assert homes.candidates("r1", ("a", "b")) == ("a",)
    assert homes.candidates("r1", ("b",)) == ()  # its engine no longer serves the model
    assert homes.candidates("unknown", ("a", "b")) == ()


def test_response_homes_ignores_ids_no_engine_gives() -> None:
    homes = ResponseHomes()
    homes.learn("", "a")
    homes.learn("x" * (MAX_ID_CHARS + 1), "a")
    assert len(homes) == 0
    with pytest.raises(ValueError):
        ResponseHomes(capacity=0)
