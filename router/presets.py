"""The policy presets: the YAML files of the repository's top-level policies/ folder.

They ship as the data package ``router.policies`` (pyproject.toml maps that package onto
policies/), so importlib.resources finds them the same way in an editable install of a checkout
and in an installed wheel, whatever the current folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT = "kv-aware"
NAMES = ("round-robin", "least-load", "consistent-hash", "kv-aware")
PACKAGE = "router.policies"


def preset_dir() -> Path:
    """The folder of the preset files, as a real filesystem path.

    Callers watch a preset file for hot reload, so they need a path, not only a resource.
    Setuptools installs package data as plain files (a wheel is unpacked into site-packages, an
    editable install points at the checkout's policies/), so the resource root is a directory
    and its string is its path. Anything else (a zip import) is refused rather than misread.
    """
    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError as e:  # an editable install made before the presets shipped
        raise RuntimeError(f"{PACKAGE} is missing: reinstall kvrouter (make install)") from e
    path = Path(str(root))
    if not (path / f"{DEFAULT}.yaml").is_file():
        raise RuntimeError(f"{PACKAGE} is not a folder of preset files: {root!r}")
    return path


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (a name from ``NAMES``)."""
    return preset_dir() / f"{name}.yaml"


def resolve(spec: str) -> Path:
    """A policy argument: an existing file path, or the name of a preset."""
    p = Path(spec)
    if p.exists() or spec not in NAMES:
        return p
    return preset_path(spec)
