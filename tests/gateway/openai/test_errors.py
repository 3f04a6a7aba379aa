"""The error tree drawn in router.gateway.openai.errors is the tree the classes make."""

from __future__ import annotations

import importlib

from router.gateway.openai import errors
from router.gateway.openai.errors import GatewayError

# Modules outside router.gateway.openai.errors that define GatewayError subclasses.
DEFINERS = ["router.gateway.inbound.auth", "router.enginesim.app"]


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, with the parent it is drawn under."""
    doc = errors.__doc__ or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("GatewayError"))
    root = lines[start].index("GatewayError")
    parents: dict[str, str | None] = {"GatewayError": None}
    path = ["GatewayError"]  # the branch drawn down to the line before
    for line in lines[start + 1 :]:
        marker = max(line.find("├── "), line.find("└── "))
        if marker < 0:
            break
        depth = (marker - root) // 4 + 1
        name = line[marker + 4 :].split()[0]
        del path[depth:]
        parents[name] = path[-1]
        path.append(name)
    return parents


def class_tree() -> dict[str, str | None]:
    """Each GatewayError subclass router defines, with its parent."""
    for name in DEFINERS:
        importlib.import_module(name)
    found: dict[str, str | None] = {"GatewayError": None}
    todo = [GatewayError]
    for _ in range(1000):  # bounded: the tree has a few dozen classes
        if not todo:
            break
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("router."):  # not a test's own subclass
                found[sub.__name__] = cls.__name__
                todo.append(sub)
    return found


def test_error_tree_drawing_names_every_class_under_its_parent() -> None:
    drawn, real = drawn_tree(), class_tree()
    assert len(drawn) > 10, "the drawing was not found where the test looks"
    assert drawn == real
