"""Strict reading of parsed YAML, field by field, with the path of whatever is wrong.

Shared by the policy loader and the gateway's config loader so that both report errors the
same way: ``<where>: <field path>: <reason>``, for example
``policy.yaml: scorers[1].weight: must be a number from 0.0 to 1000.0, got 'high'``.
A reader raises its subclass's ``error`` type; unknown keys are errors once ``done`` is called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Self

import yaml


def show(v: Any) -> str:
    """A value as an error message quotes it: its repr, cut to 60 characters."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_yaml(text: str, where: str, error: type[ValueError]) -> Any:
    """Parse YAML text; a syntax error raises ``error`` naming ``where``, line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise error(f"{where}: {at}invalid YAML: {problem}") from None


def read_yaml_file(path: str | Path, error: type[ValueError]) -> tuple[Any, str]:
    """A YAML file's parsed content and its name for messages; ``error`` on any failure.

    The one file read of the core's loaders (policies and configs are read whole, once).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read: {e}") from None
    return parse_yaml(text, str(p), error), str(p)


class ConfigError(ValueError):
    """A setting that cannot be used (file, flag or environment); the message says where and why."""


class Fields:
    """A mapping read field by field; reports the path of whatever is wrong."""

    error: ClassVar[type[ValueError]] = ValueError

    def __init__(self, data: Any, path: str, where: str) -> None:
        self.where = where
        self.path = path
        if not isinstance(data, Mapping):
            self.fail(path, f"must be a mapping, got {show(data)}")
        self.data: Mapping[str, Any] = data
        self.used: set[str] = set()

    def fail(self, path: str, reason: str) -> NoReturn:
        raise self.error(f"{self.where}: {path or '(top level)'}: {reason}")

    def at(self, key: str) -> str:
        """The full path of ``key`` in this mapping."""
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def text(self, key: str, default: str, required: bool = False) -> str:
        v = self._get(key)
        if v is None:
            if required:
                self.fail(self.at(key), "is required")
            return default
        if not isinstance(v, str):
            self.fail(self.at(key), f"must be a string, got {show(v)}")
        return str(v)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.text(key, default)
        if v not in choices:
            self.fail(self.at(key), f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        v = self._get(key)
        if v is None:
            return default
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            self.fail(self.at(key), f"must be an integer from {lo} to {hi}, got {show(v)}")
        return int(v)

    def number(self, key: str, default: float, lo: float, hi: float) -> float:
        v = self._get(key)
        if v is None:
            return default
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or not lo <= v <= hi:
            self.fail(self.at(key), f"must be a number from {lo} to {hi}, got {show(v)}")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self._get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.fail(self.at(key), f"must be true or false, got {show(v)}")
        return bool(v)

    def texts(self, key: str) -> list[str]:
        """A list of strings (empty when absent)."""
        v = self._get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(self.at(key), f"must be a list of strings, got {show(v)}")
        for i, x in enumerate(v):
            if not isinstance(x, str):
                self.fail(f"{self.at(key)}[{i}]", f"must be a string, got {show(x)}")
        return list(v)

    def sub(self, key: str) -> Self | None:
        v = self._get(key)
        return None if v is None else type(self)(v, self.at(key), self.where)

    def items(self, key: str) -> list[Self]:
        v = self._get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(self.at(key), f"must be a list, got {show(v)}")
        return [type(self)(x, f"{self.at(key)}[{i}]", self.where) for i, x in enumerate(v)]

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            self.fail(self.at(unknown[0]), "unknown field")
