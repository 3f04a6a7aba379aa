"""Addresses: ``HOST:PORT`` text both ways (the one parser every address setting goes through),
loopback, and ports free on it.

``[V6]:PORT`` is how an IPv6 literal is written; the brackets are not part of the host.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


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


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct loopback TCP ports that nothing listens on right now."""
    # All bound at once, so the kernel cannot hand out the same port twice.
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One loopback TCP port that nothing listens on right now."""
    return free_ports(1)[0]
