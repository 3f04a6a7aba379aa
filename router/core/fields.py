"""Strict reading of parsed YAML, field by field, with the path of whatever is wrong.

Shared by the policy loader and the gateway's config loader so that both report errors the
same way: ``<where>: <field path>: <reason>``, for example
``policy.yaml: scorers[1].weight: must be a number from 0.0 to 1000.0, got 'high'``.
A reader raises its subclass's ``error`` type; unknown keys are errors once ``done`` is called.

Policy and config files are small and hand-written, so their reading is bounded well above any
real one: at most ``MAX_YAML_BYTES``, checked before parsing; at most ``MAX_YAML_ALIASES``
aliases (``*name``), which is what refuses an alias bomb (a few hundred bytes whose aliases
expand to billions of nodes for anything that walks them); nesting at most ``MAX_YAML_DEPTH``
deep. Error messages quote values through ``show``, which never walks more than a few elements.
The readers take text, never a path: the shell opens the files (``router.yaml_files``).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn, Self

import yaml
from yaml.composer import ComposerError
from yaml.nodes import Node

# The largest presets and chart-rendered configs are a few KiB.
MAX_YAML_BYTES = 1024 * 1024
# Anchors are rare in policies and configs; a bomb needs dozens of aliases to grow.
MAX_YAML_ALIASES = 64
# A policy nests four levels deep; PyYAML composes recursively, and Python's stack would not
# hold a few thousand levels.
MAX_YAML_DEPTH = 64

# Three levels and a few elements of each: quoting a value can never walk a large structure.
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict = 3, 4, 4, 4
_repr.maxset = _repr.maxfrozenset = _repr.maxdeque = _repr.maxarray = 4
_repr.maxstring, _repr.maxlong, _repr.maxother = 50, 50, 50


def show(v: Any) -> str:
    """A value as an error message quotes it: a bounded repr, cut to 60 characters."""
    if isinstance(v, bytes | bytearray):
        v = bytes(v[:64])  # reprlib would render the whole of a bytes value first
    text = _repr.repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting aliases and nesting as it composes the document."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                self._refuse(
                    f"more than {MAX_YAML_ALIASES} aliases (*name); refused as a possible "
                    "alias bomb"
                )
        if self._depth >= MAX_YAML_DEPTH:
            self._refuse(f"nested more than {MAX_YAML_DEPTH} levels deep")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _refuse(self, problem: str) -> NoReturn:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        raise ComposerError(None, None, problem, mark)


TOO_LARGE = f"larger than the {MAX_YAML_BYTES}-byte limit of a policy or config file"


def parse_yaml(text: str, where: str, error: type[ValueError]) -> Any:
    """Parse YAML text; any failure raises ``error`` naming ``where`` (and line and column).

    Bounded: see ``MAX_YAML_BYTES``, ``MAX_YAML_ALIASES`` and ``MAX_YAML_DEPTH``.
    """
    size = len(text)  # characters: never more than the UTF-8 bytes
    if size <= MAX_YAML_BYTES and not text.isascii():
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise error(f"{where}: {TOO_LARGE}")
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a safe loader: plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise error(f"{where}: {at}invalid YAML: {problem}") from None
    except Exception as e:
        # PyYAML's constructors raise whatever they meet building a scalar: ValueError for a
        # date like 2024-02-30 or an int of more than 4300 digits, AttributeError for a
        # '!!timestamp' that is none. Any of them is a file that cannot be used.
        raise error(f"{where}: invalid YAML: {show(str(e) or type(e).__name__)}") from None


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
            self.fail(self.at(key), f"must be one of {', '.join(choices)}, got {show(v)}")
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
        # An int is compared as it is: a huge one is out of range, not an OverflowError.
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        if not ok or (isinstance(v, float) and not math.isfinite(v)) or not lo <= v <= hi:
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

    def values(self, key: str) -> list[Any]:
        """A list of anything, checked by the caller (empty when absent)."""
        v = self._get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(self.at(key), f"must be a list, got {show(v)}")
        return list(v)

    def sub(self, key: str) -> Self | None:
        v = self._get(key)
        return None if v is None else type(self)(v, self.at(key), self.where)

    def items(self, key: str) -> list[Self]:
        """A list of mappings (empty when absent)."""
        where = self.at(key)
        return [type(self)(x, f"{where}[{i}]", self.where) for i, x in enumerate(self.values(key))]

    def done(self) -> None:
        # YAML keys need not be strings (1: x, null: y): order and name them as text.
        unknown = sorted(str(k) for k in set(self.data) - self.used)
        if unknown:
            key = unknown[0]
            self.fail(self.at(key if len(key) <= 60 else key[:57] + "..."), "unknown field")


# The longest duration a setting may take, in seconds.
DAY = 86_400.0


class ConfigFields(Fields):
    """Fields of the gateway's config file: its errors are ``ConfigError``."""

    error = ConfigError

    def seconds(self, key: str, default: float, lo: float = 0.01) -> float:
        """A duration in seconds, from ``lo`` to a day."""
        return self.number(key, default, lo, DAY)
