"""Helpers for the image tests: the Dockerfile split into stages, .dockerignore's matching.

Parsed from the files' text, as Docker reads them, since no container engine runs the build.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@cache
def stages() -> list[Stage]:
    """The repository's Dockerfile, parsed once."""
    return parse_dockerfile(DOCKERFILE.read_text())


def dockerfile_uid() -> int:
    """The user id the image's final stage runs as (the chart's pods must run as it too)."""
    user = stages()[-1].last("USER")
    assert user is not None, "the final stage sets no USER"
    return int(user.args.split(":")[0])


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case) and its argument text."""

    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """Arguments of ENTRYPOINT/CMD in exec (JSON) form, or the shell form split."""
        text = self.args.strip()
        if text.startswith("["):
            parsed: list[str] = json.loads(text)
            return parsed
        return shlex.split(text)


@dataclass
class Stage:
    """A build stage: its base image, its name (if any) and its instructions."""

    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def runs(self) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == "RUN"]

    def last(self, keyword: str) -> Instruction | None:
        found = [i for i in self.instructions if i.keyword == keyword]
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Stage]:
    """Split a Dockerfile into stages (line continuations joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, args.strip()))
        elif keyword != "ARG":
            raise AssertionError(f"Dockerfile instruction before the first FROM: {line}")
    return stages


def dockerignore_excludes(patterns: Sequence[str], path: str) -> bool:
    """Whether Docker leaves ``path`` (relative, with /) out of the build context.

    The last matching pattern wins; ``!`` re-includes; a pattern that matches a folder covers
    everything inside it; ``**`` spans folders.
    """

    def matches(pattern: str) -> bool:
        regex = _glob_regex(pattern)
        parts = path.split("/")
        return any(re.fullmatch(regex, "/".join(parts[: n + 1])) for n in range(len(parts)))

    excluded = False
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip().strip("/")
        if matches(pattern):
            excluded = not negate
    return excluded


def _glob_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regular expression over a relative path."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            ch = pattern[i]
            out.append("[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch))
            i += 1
    return "".join(out)
