"""The policy presets: the YAML files of the repository's top-level policies/ folder.

They ship as the data package ``router.policies`` (pyproject.toml maps that package onto
policies/), so importlib.resources finds them the same way in an editable install of a checkout
and in an installed wheel, whatever the current folder.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def preset_text(name: str, settings: Mapping[str, object]) -> str:
    """Preset ``name``'s YAML with ``settings`` (dotted paths, one level deep) set, comments kept.

    For tools that install a preset told something about the fleet (an operator's
    ``index.engine_capacity_tokens``, a ``cold_prefix`` choice). Each setting must already be
    written in the preset, so a renamed field fails loudly instead of being ignored.
    """
    lines = preset_path(name).read_text().splitlines(keepends=True)
    for path, value in settings.items():
        section, _, key = path.rpartition(".")
        start, end = 0, len(lines)
        if section:
            heads = [i for i, line in enumerate(lines) if line.startswith(f"{section}:")]
            if not heads:
                raise KeyError(f"preset {name!r} has no section {section!r}")
            start = heads[0] + 1
            end = next(
                (i for i in range(start, len(lines)) if lines[i][:1] not in (" ", "\n", "#")),
                len(lines),
            )
        indent = "  " if section else ""
        at = [i for i in range(start, end) if lines[i].startswith(f"{indent}{key}:")]
        if len(at) != 1:
            raise KeyError(f"preset {name!r} does not set {path!r}")
        lines[at[0]] = f"{indent}{key}: {value}\n"
    return "".join(lines)
