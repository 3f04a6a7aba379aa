"""The layout is part of the design: these tests keep it so.

- No import cycles between router's modules, counting every import Python runs, function-local
  ones included (a cycle closed inside a function is still a cycle); TYPE_CHECKING ones are not
  run.
- The core is pure: it imports only the standard library, its declared pure dependencies and
  other core modules.
- The gossip library knows nothing of the index, the decision or the gateway.
- The gateway's sub-packages keep their layers (router/gateway/__init__.py draws them), counting
  every import, function-local ones included.
- A function-local import says why in a comment (on its line or the line above).
- No hand-written module is much over 500 lines (540 at most).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "router"
GENERATED = PACKAGE / "gossip" / "pb"
# "About 500 lines": a few over is judgement, far over is a module doing two jobs.
MAX_LINES = 540
CORE_THIRD_PARTY = {"xxhash", "uhashring", "yaml", "msgpack"}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = modules()


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def top_level_imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[str]:
    """Modules imported when ``name`` is imported (not under TYPE_CHECKING, not in functions)."""
    base = name if is_package else name.rpartition(".")[0]
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and not _type_checking(node):
            stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody)
            for h in node.handlers:
                stack.extend(h.body)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                mod = f"{pkg}.{node.module}" if node.module else pkg
            else:
                mod = node.module or ""
            yield mod
            for a in node.names:  # ``from package import module``
                if f"{mod}.{a.name}" in MODULES:
                    yield f"{mod}.{a.name}"


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for mod in top_level_imports(tree, name, path.name == "__init__.py"):
            # Importing a.b.c runs a, a.b and a.b.c.
            parts = mod.split(".")
            deps |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        g[name] = {d for d in deps if d in MODULES and d != name}
    return g


def run_imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[str]:
    """Modules ``name`` imports anywhere Python may run it: at the top or in a function, not
    under TYPE_CHECKING."""
    base = name if is_package else name.rpartition(".")[0]
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                mod = f"{pkg}.{node.module}" if node.module else pkg
            else:
                mod = node.module or ""
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES)
        else:
            stack.extend(ast.iter_child_nodes(node))


def run_graph() -> dict[str, set[str]]:
    """Module -> the router modules it runs, parent packages included."""
    g: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for mod in run_imports(tree, name, path.name == "__init__.py"):
            parts = mod.split(".")
            deps |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        g[name] = {d for d in deps if d in MODULES and d != name}
    return g


def test_no_import_cycles() -> None:
    g = run_graph()
    state: dict[str, int] = {}  # 1 visiting, 2 done
    cycles: list[list[str]] = []

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for d in sorted(g[n]):
            if state.get(d) == 1:
                cycles.append([*path[path.index(d) :], d] if d in path else [n, d])
            elif d not in state:
                visit(d, [*path, d])
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [n])
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    real = [c for c in cycles if not all(_within(c[0], x) or _within(x, c[0]) for x in c)]
    assert real == []


def test_core_is_pure() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name, path in MODULES.items():
        if not name.startswith("router.core"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                ok = mod.startswith("router.core") or top in stdlib or top in CORE_THIRD_PARTY
                assert ok, f"{name} imports {mod}: the core imports no I/O shell"


def test_gossip_knows_nothing_of_the_router() -> None:
    allowed = {"router", "router.hostport", "router.core", "router.core.fields", "router.core.seq"}
    g = graph()
    for name, deps in g.items():
        if name.startswith("router.gossip"):
            outside = {d for d in deps if not d.startswith("router.gossip")} - allowed
            assert not outside, f"{name} imports {sorted(outside)}"


def _local_imports(tree: ast.Module) -> Iterator[ast.stmt]:
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    yield node


@pytest.mark.parametrize("name", sorted(MODULES))
def test_function_local_imports_say_why(name: str) -> None:
    path = MODULES[name]
    lines = path.read_text().splitlines()
    for node in _local_imports(ast.parse("\n".join(lines), str(path))):
        here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
        assert "#" in here or above.startswith("#"), (
            f"{path.relative_to(ROOT)}:{node.lineno}: a function-local import hides a "
            "dependency; import at the top, or say why in a comment"
        )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name: str) -> None:
    n = len(MODULES[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {n} lines: split it by idea"


def every_import(name: str) -> set[str]:
    """Router modules ``name`` imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    path = MODULES[name]
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                mod = f"{pkg}.{node.module}" if node.module else pkg
            else:
                mod = node.module or ""
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES}
    return {m for m in found if m in MODULES and m != name}


def _within(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


GATEWAY = "router.gateway"
# (importer, what it may import of the gateway, or None for "anything but the listed").
LAYERS: list[tuple[str, set[str]]] = [
    # The protocol, no I/O: nothing else of the gateway.
    (f"{GATEWAY}.openai", {f"{GATEWAY}.openai"}),
    # The engines' side: the protocol, nothing of the client's side or the app.
    (f"{GATEWAY}.upstream", {f"{GATEWAY}.openai", f"{GATEWAY}.upstream"}),
    # engine-sim speaks the protocol and shares nothing else with the gateway.
    ("router.enginesim", {f"{GATEWAY}.openai"}),
]
FORBIDDEN: list[tuple[str, set[str]]] = [
    # Which engines exist and how they are never depends on a request's life.
    (f"{GATEWAY}.fleet", {f"{GATEWAY}.inbound", f"{GATEWAY}.exchange", f"{GATEWAY}.app"}),
    (f"{GATEWAY}.openai", {f"{GATEWAY}.app", f"{GATEWAY}.exchange"}),
]


@pytest.mark.parametrize(("importer", "allowed"), LAYERS, ids=[x for x, _ in LAYERS])
def test_package_imports_only_its_layers(importer: str, allowed: set[str]) -> None:
    for name in MODULES:
        if not _within(name, importer):
            continue
        gateway_deps = {d for d in every_import(name) if _within(d, GATEWAY) and d != GATEWAY}
        wrong = {d for d in gateway_deps if not any(_within(d, a) for a in allowed)}
        assert not wrong, f"{name} imports {sorted(wrong)}: outside its layer"


@pytest.mark.parametrize(("importer", "banned"), FORBIDDEN, ids=[x for x, _ in FORBIDDEN])
def test_package_never_imports(importer: str, banned: set[str]) -> None:
    for name in MODULES:
        if _within(name, importer):
            wrong = {d for d in every_import(name) if any(_within(d, b) for b in banned)}
            assert not wrong, f"{name} imports {sorted(wrong)}"


def test_only_the_runtime_imports_the_app() -> None:
    runtime = f"{GATEWAY}.runtime"
    for name in MODULES:
        if _within(name, runtime) or name == f"{GATEWAY}.app":
            continue
        assert f"{GATEWAY}.app" not in every_import(name), f"{name} imports the app"
