"""Policy and config files read from disk: the shell side of the core's YAML loaders.

The core parses text (``router.core.fields.parse_yaml``, ``router.core.policy.load_policy_text``)
and never opens a file; the commands and the gateway read files through here, so every file
error reads the same: ``<file>: cannot read: <reason>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.core.fields import MAX_YAML_BYTES, TOO_LARGE, parse_yaml
from router.core.policy import Policy, PolicyError, parse_policy


def read_capped(path: Path) -> bytes:
    """The file's bytes, up to one past the loaders' limit (enough to refuse it); ``OSError``
    when it cannot be read."""
    with path.open("rb") as f:
        return f.read(MAX_YAML_BYTES + 1)


def read_yaml_file(path: str | Path, error: type[ValueError]) -> tuple[Any, str]:
    """A YAML file's parsed content and its name for messages; ``error`` on any failure.

    Policies and configs are read whole, once, and never beyond ``MAX_YAML_BYTES`` + 1 bytes.
    """
    p = Path(path)
    try:
        raw = read_capped(p)
        if len(raw) > MAX_YAML_BYTES:
            raise error(f"{p}: {TOO_LARGE}")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read: {e}") from None
    return parse_yaml(text, str(p), error), str(p)


def load_policy(path: str | Path) -> Policy:
    """Read and parse a policy file; raises ``PolicyError`` naming the file and the field."""
    data, where = read_yaml_file(path, PolicyError)
    return parse_policy(data, where)
