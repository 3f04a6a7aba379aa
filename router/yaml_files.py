"""The YAML files kvrouter reads, policies and the config: bounded, with one set of messages.

The core parses text (``router.core.fields.parse_yaml``, which bounds aliases and nesting, and
``router.core.policy.load_policy_text``) and never opens a file; the commands, the gateway and
its policy watcher read files through here. ``read_bytes`` reads at most one byte past
``MAX_YAML_BYTES`` (enough to refuse a larger file without reading it all), ``text_of`` refuses
a file over the limit or not UTF-8, and ``read_text`` is both. The policy watcher hashes the
bytes before it decodes them, so that a file is read once per look and a rejected content is
known again by its hash.
"""

from __future__ import annotations

from pathlib import Path

from router.core.fields import MAX_YAML_BYTES, TOO_LARGE
from router.core.policy import Policy, PolicyError, load_policy_text


def read_bytes(path: Path, error: type[ValueError]) -> bytes:
    """Up to ``MAX_YAML_BYTES`` + 1 bytes of the file; raises ``error`` naming it and why."""
    try:
        with path.open("rb") as f:
            return f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None


def text_of(raw: bytes, where: str, error: type[ValueError]) -> str:
    """The text of a file's bytes; raises ``error`` naming ``where`` when too large or not
    UTF-8."""
    if len(raw) > MAX_YAML_BYTES:
        raise error(f"{where}: {TOO_LARGE}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text: {e}") from None


def read_text(path: Path, error: type[ValueError]) -> str:
    """The file's text; raises ``error`` naming the file and the reason."""
    return text_of(read_bytes(path, error), str(path), error)


def load_policy(path: str | Path) -> Policy:
    """Read and parse a policy file; raises ``PolicyError`` naming the file and the field."""
    p = Path(path)
    return load_policy_text(read_text(p, PolicyError), str(p))
