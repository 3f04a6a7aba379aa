"""``HOST:PORT`` text, both ways: the one parser every address setting goes through.

``[V6]:PORT`` is how an IPv6 literal is written; the brackets are not part of the host.
"""

from __future__ import annotations


def split(text: str, *, port_zero: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); raises ``ValueError`` saying what was expected."""
    host, sep, port = text.strip().rpartition(":")
    lo = 0 if port_zero else 1
    if not sep or not port.isdigit() or not lo <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT with a port from {lo} to 65535, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"must be HOST:PORT with a host, got {text!r}")
    return host, int(port)


def join(host: str, port: int) -> str:
    """The inverse of ``split``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
