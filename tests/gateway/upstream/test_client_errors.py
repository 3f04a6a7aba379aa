"""The engine client's one mapping point: every lower-layer failure becomes its UpstreamError.

The layers under router.gateway.upstream.client (connections, http1, the sockets) raise only
the kinds ``EXCEPTION_MAP`` lists; ``upstream_error`` turns each into the error tree's class for
what the call was doing (connecting, or reading an answer).
"""

from __future__ import annotations

import ast
import builtins
import socket
import ssl
from pathlib import Path
from types import ModuleType

import pytest

from router.gateway.openai.errors import (
    UpstreamConnectError,
    UpstreamDropped,
    UpstreamError,
    UpstreamTimeout,
)
from router.gateway.upstream import client, connections, http1
from router.gateway.upstream.client import EXCEPTION_MAP, LOWER_ERRORS, upstream_error
from router.gateway.upstream.http1 import WireError

ENGINE = "http://engine-a:8000"

# (a lower-layer failure, what it is while connecting, what it is once the request is sent)
CASES: list[tuple[Exception, type[UpstreamError], type[UpstreamError]]] = [
    (WireError("not an HTTP/1.x status line"), UpstreamConnectError, UpstreamDropped),
    (TimeoutError(), UpstreamConnectError, UpstreamTimeout),
    (TimeoutError("timed out after 1s on GET /health"), UpstreamConnectError, UpstreamTimeout),
    (ConnectionRefusedError(111, "Connection refused"), UpstreamConnectError, UpstreamDropped),
    (ConnectionResetError("closed the connection"), UpstreamConnectError, UpstreamDropped),
    (ConnectionAbortedError("the gateway is closing"), UpstreamConnectError, UpstreamDropped),
    (BrokenPipeError(), UpstreamConnectError, UpstreamDropped),
    (socket.gaierror(-2, "Name or service not known"), UpstreamConnectError, UpstreamDropped),
    (ssl.SSLCertVerificationError("certificate verify failed"), UpstreamConnectError,
     UpstreamDropped),
    (OSError(113, "No route to host"), UpstreamConnectError, UpstreamDropped),
    (ValueError("not an http(s) URL"), UpstreamConnectError, UpstreamDropped),
]  # fmt: skip


@pytest.mark.parametrize(
    ("exc", "connecting", "expected"),
    [(exc, True, before) for exc, before, _ in CASES]
    + [(exc, False, after) for exc, _, after in CASES],
    ids=[f"{type(e).__name__}-connecting" for e, _, _ in CASES]
    + [f"{type(e).__name__}-answering" for e, _, _ in CASES],
)
def test_upstream_error_every_lower_kind_mapped_by_phase(
    exc: Exception, connecting: bool, expected: type[UpstreamError]
) -> None:
    got = upstream_error(exc, ENGINE, connecting=connecting)
    assert type(got) is expected
    assert got.engine == ENGINE and ENGINE in got.message
    assert got.message.strip() != ENGINE  # it says what happened, not only where
    if connecting:
        assert not got.request_shaped  # no request reached the engine: its health is at stake


def test_upstream_error_not_a_lower_failure_is_a_bug_not_an_engine_error() -> None:
    with pytest.raises(TypeError):
        upstream_error(RuntimeError("a bug"), ENGINE)


def _exceptions_made(module: ModuleType) -> set[type[BaseException]]:
    """Exception classes ``module`` constructs or raises by name."""
    tree = ast.parse(Path(str(module.__file__)).read_text())
    made: set[type[BaseException]] = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name):
            name = node.exc.id
        value = getattr(module, name, getattr(builtins, name, None)) if name else None
        if isinstance(value, type) and issubclass(value, BaseException):
            made.add(value)
    return made


@pytest.mark.parametrize("module", [connections, http1], ids=["connections", "http1"])
def test_lower_layers_raise_only_mapped_kinds(module: ModuleType) -> None:
    made = _exceptions_made(module)
    assert made, "the walk found nothing: it no longer sees how the module raises"
    assert all(issubclass(kind, LOWER_ERRORS) for kind in made), made
    assert not any(issubclass(kind, UpstreamError) for kind in made)
    # Nor do they know the error tree at all: the client is the one mapping point.
    assert "router.gateway.openai" not in Path(str(module.__file__)).read_text()


def test_client_builds_upstream_errors_only_through_the_map() -> None:
    tree = ast.parse(Path(str(client.__file__)).read_text())
    mapped = {cls.__name__ for _, before, after in EXCEPTION_MAP for cls in (before, after)}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name != "upstream_error":
            calls = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call)
                     if isinstance(n.func, ast.Name)}  # fmt: skip
            assert not calls & mapped, f"{fn.name} builds {sorted(calls & mapped)}"
