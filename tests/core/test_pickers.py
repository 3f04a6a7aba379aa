"""Pickers: one engine among the scored candidates, ties and cold prefixes on the ring."""

from __future__ import annotations

import pytest

from router.core.pickers import PICKERS, Choice
from router.core.ring import BoundedLoadRing
from router.core.scorers.base import Inputs

ENGINES = ["a", "b", "c", "d"]
KEY = 12345


def ring() -> BoundedLoadRing:
    r = BoundedLoadRing()
    r.set_engines(dict.fromkeys(ENGINES, 1))
    return r


def choice(
    totals: list[float],
    eligible: list[bool] | None = None,
    overlaps: list[int] | None = None,
    *,
    turn: int = 0,
    cold_ring: bool = False,
    cands: list[str] | None = None,
) -> Choice:
    cands = ENGINES if cands is None else cands
    n = len(cands)
    x = Inputs(
        candidates=cands,
        blocks=4,
        overlaps=overlaps if overlaps is not None else [1] * n,
        requests=[0] * n,
        tokens=[0] * n,
        session_engine=None,
    )
    ok = eligible if eligible is not None else [True] * n
    return Choice(x, ok, totals, KEY, ring(), turn, cold_ring)


HOME = ring().home(KEY)


@pytest.mark.parametrize("name", list(PICKERS))
def test_pickers_without_candidates_pick_nothing(name: str) -> None:
    assert PICKERS[name].pick(choice([], cands=[])) == (None, "no-candidates")


def test_picker_max_score_takes_the_best_eligible() -> None:
    pick = PICKERS["max-score"].pick
    assert pick(choice([0.1, 0.9, 0.5, 0.2])) == ("b", "best-score")
    assert pick(choice([0.1, 0.9, 0.5, 0.2], [True, False, True, True])) == ("c", "best-score")


def test_picker_max_score_tie_goes_to_the_ring_home() -> None:
    assert PICKERS["max-score"].pick(choice([0.5] * 4)) == (HOME, "best-score")


def test_picker_max_score_cold_prefix_to_its_ring_home_only_with_cold_ring() -> None:
    cold = [0, 0, 0, 0]
    best = "a" if HOME != "a" else "b"
    totals = [1.0 if e == best else 0.0 for e in ENGINES]
    pick = PICKERS["max-score"].pick
    assert pick(choice(totals, overlaps=cold, cold_ring=True)) == (HOME, "cold-prefix-ring")
    assert pick(choice(totals, overlaps=cold)) == (best, "best-score")


@pytest.mark.parametrize(("turn", "engine"), [(0, "b"), (1, "c"), (3, "a"), (7, "a")])
def test_picker_round_robin_the_one_after_the_turn(turn: int, engine: str) -> None:
    got = PICKERS["round-robin"].pick(choice([0.0] * 4, turn=turn, cold_ring=True))
    assert got == (engine, "round-robin")


def test_picker_ring_walks_past_ineligible_engines() -> None:
    pick = PICKERS["ring"].pick
    assert pick(choice([0.0] * 4)) == (HOME, "ring")
    eligible = [e != HOME for e in ENGINES]
    second = ring().home(KEY, lambda e: e != HOME)
    assert pick(choice([0.0] * 4, eligible)) == (second, "ring")


def test_pickers_registry_says_which_read_scores() -> None:
    assert {n: t.scored for n, t in PICKERS.items()} == {
        "max-score": True,
        "round-robin": False,
        "ring": False,
    }
