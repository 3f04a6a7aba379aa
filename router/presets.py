"""The policy presets shipped in policies/, found from a source checkout or an install."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT = "kv-aware"
NAMES = ("round-robin", "least-load", "consistent-hash", "kv-aware")


def preset_dir() -> Path:
    """Where the preset files are: the checkout's policies/, else the installed copy."""
    checkout = Path(__file__).resolve().parent.parent / "policies"
    if (checkout / f"{DEFAULT}.yaml").is_file():
        return checkout
    return Path(str(resources.files("router.presets")))


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (a name from ``NAMES``)."""
    return preset_dir() / f"{name}.yaml"


def resolve(spec: str) -> Path:
    """A policy argument: an existing file path, or the name of a preset."""
    p = Path(spec)
    if p.exists() or spec not in NAMES:
        return p
    return preset_path(spec)
