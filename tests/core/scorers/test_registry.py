"""The scorer registry: every type registered once, scores in [0, 1], params documented."""

from __future__ import annotations

import pkgutil
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import router.core.scorers
from router.core.pickers import PICKERS
from router.core.scorers.base import Inputs, ScorerType, limits
from router.core.scorers.registry import SCORER_TYPES, SCORERS
from router.presets import preset_path

# The modules of router/core/scorers that are not a scorer type.
SHARED = {"base", "registry"}


def test_registry_holds_every_scorer_module_once() -> None:
    names = {m.name for m in pkgutil.iter_modules(router.core.scorers.__path__)} - SHARED
    modules = {t.score.__module__.rpartition(".")[2] for t in SCORERS.values()}
    assert modules == names
    assert tuple(SCORERS) == SCORER_TYPES and len(set(SCORER_TYPES)) == len(SCORER_TYPES)
    for name, t in SCORERS.items():
        assert t.name == name and re.fullmatch(r"[a-z]+(-[a-z]+)*", name)


def variants(t: ScorerType[Any]) -> list[Any]:
    """The type's default params, and one set per choice of each choice-valued param."""
    out = [t.params()]
    for lim in limits(t.params):
        out += [t.params(**{lim.name: c}) for c in lim.choices]
    return out


@given(
    n=st.integers(1, 12),
    data=st.data(),
)
def test_scorers_stay_in_unit_interval(n: int, data: st.DataObject) -> None:
    blocks = data.draw(st.integers(0, 50))
    x = Inputs(
        candidates=[f"e{i}" for i in range(n)],
        blocks=blocks,
        overlaps=data.draw(st.lists(st.integers(0, blocks), min_size=n, max_size=n)),
        requests=data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
        tokens=data.draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n)),
        session_engine=data.draw(st.sampled_from([None, "e0", "x"])),
        prompt_tokens=data.draw(st.integers(0, 10**6)),
        block_tokens=data.draw(st.integers(1, 1024)),
    )
    for name, t in SCORERS.items():
        for params in variants(t):
            scores = t.score(params, x)
            assert len(scores) == n
            assert all(0.0 <= v <= 1.0 for v in scores), (name, params, scores)


# -- every param documented in the default preset ----------------------------------------------


def _number(v: float | tuple[str, ...]) -> str:
    """A default or limit as the preset's comments write it: 2048, 0.9, 10000000, true, []."""
    if isinstance(v, tuple):
        return f"[{', '.join(v)}]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(int(v)) if float(v).is_integer() else str(v)


def entries(text: str) -> dict[str, list[str]]:
    """The preset's scorer entries by type, written out or in comments (``# - type: x``), each
    as its lines with the comment marks taken off."""
    lines = text.splitlines()
    start = lines.index("scorers:")
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break  # the next top-level key
        body = re.sub(r"^[\s#]*", "", line)
        m = re.fullmatch(r"- type: ([a-z-]+)", body)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None:
            current.append(body)
    return out


def undocumented(text: str) -> list[str]:
    """What the preset fails to say of each registered scorer: its entry, every param's key,
    and in the param's comment its default and its limits."""
    found = entries(text)
    missing = []
    for name, t in SCORERS.items():
        entry = found.get(name)
        if entry is None:
            missing.append(f"{name}: no entry")
            continue
        for lim in limits(t.params):
            at = next((i for i, s in enumerate(entry) if s.startswith(f"{lim.name}:")), None)
            if at is None:
                missing.append(f"{name}.{lim.name}: no key")
                continue
            # The comment above the key, back to the previous key.
            above = []
            for s in reversed(entry[:at]):
                if re.match(r"[a-z_]+:", s):
                    break
                above.append(s)
            comment = " ".join(reversed(above))
            d = lim.default
            want = [f"Default {d if isinstance(d, str) else _number(d)}"]
            if lim.lo is not None and lim.hi is not None:
                want.append(f"from {_number(lim.lo)} to {_number(lim.hi)}")
            want += list(lim.choices)
            missing += [f"{name}.{lim.name}: {w!r}" for w in want if w not in comment]
    return missing


def test_every_scorer_param_documented_in_kv_aware() -> None:
    assert undocumented(preset_path("kv-aware").read_text()) == []


def test_documentation_check_fails_when_a_param_is_missing() -> None:
    text = preset_path("kv-aware").read_text()
    # Take the comment line that gives ttft-estimate's wait_tokens its limits out.
    cut = "\n".join(s for s in text.splitlines() if "Default 2048" not in s)
    assert any(m.startswith("ttft-estimate.wait_tokens") for m in undocumented(cut))
    gone = text.replace("max_sessions:", "sessions:")
    assert "session-affinity.max_sessions: no key" in undocumented(gone)


@pytest.mark.parametrize("picker", list(PICKERS))
def test_every_picker_documented_in_kv_aware(picker: str) -> None:
    lines = preset_path("kv-aware").read_text().splitlines()
    comment = lines[: lines.index("picker: max-score")]
    assert any(s.startswith(f"# {picker}:") for s in comment), picker


def test_params_are_frozen() -> None:
    for t in SCORERS.values():
        assert t.params.__dataclass_params__.frozen, t.name
