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
- Every module is named in its package's map, and every dotted name a docstring or comment
  gives (``router.x.y``, ``Class.member``) exists.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import sys
import tokenize
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


def imports(name: str, *, type_checking: bool = True) -> set[str]:
    """Router modules ``name`` imports anywhere: at the top and in functions (a cycle through a
    function-local import is still a cycle), and under TYPE_CHECKING unless told not to."""
    path = MODULES[name]
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node) and not type_checking:
            stack.extend(node.orelse)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                mod = f"{pkg}.{node.module}" if node.module else pkg
            else:
                mod = node.module or ""
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES}
        else:
            stack.extend(ast.iter_child_nodes(node))
    # Importing a.b.c runs a, a.b and a.b.c.
    runs = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 2)}
    return {m for m in runs if m in MODULES and m != name}


def _within(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def test_no_import_cycles() -> None:
    g = {name: imports(name, type_checking=False) for name in MODULES}
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
    for name in MODULES:
        deps = imports(name)
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
    # The endpoint picker is served beside the app, never through it.
    (f"{GATEWAY}.extproc", {f"{GATEWAY}.app"}),
]


@pytest.mark.parametrize(("importer", "allowed"), LAYERS, ids=[x for x, _ in LAYERS])
def test_package_imports_only_its_layers(importer: str, allowed: set[str]) -> None:
    for name in MODULES:
        if not _within(name, importer):
            continue
        gateway_deps = {d for d in imports(name) if _within(d, GATEWAY) and d != GATEWAY}
        wrong = {d for d in gateway_deps if not any(_within(d, a) for a in allowed)}
        assert not wrong, f"{name} imports {sorted(wrong)}: outside its layer"


@pytest.mark.parametrize(("importer", "banned"), FORBIDDEN, ids=[x for x, _ in FORBIDDEN])
def test_package_never_imports(importer: str, banned: set[str]) -> None:
    for name in MODULES:
        if _within(name, importer):
            wrong = {d for d in imports(name) if any(_within(d, b) for b in banned)}
            assert not wrong, f"{name} imports {sorted(wrong)}"


def test_only_the_runtime_imports_the_app() -> None:
    runtime = f"{GATEWAY}.runtime"
    for name in MODULES:
        if _within(name, runtime) or name == f"{GATEWAY}.app":
            continue
        assert f"{GATEWAY}.app" not in imports(name), f"{name} imports the app"


# --- maps and references ----------------------------------------------------------------------


def _docstring(name: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[name].read_text())) or ""


PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_appears_in_its_package_map(package: str) -> None:
    """Each package's docstring names each of its modules and sub-packages, as a word."""
    doc = _docstring(package)
    children = [n for n in MODULES if n.rpartition(".")[0] == package]
    missing = [
        n.rpartition(".")[2]
        for n in sorted(children)
        if not re.search(rf"(?<!\w){re.escape(n.rpartition('.')[2])}(?!\w)", doc)
    ]
    assert missing == [], f"{MODULES[package].relative_to(ROOT)}'s map does not name {missing}"


# A dotted reference into the package (router.x.y, router.x.y.Name), and a class member written
# as ``Class.member``, in a docstring or a comment.
DOTTED_REF = re.compile(r"(?<![\w.])router(?:\.[A-Za-z_]\w*)+")
MEMBER_REF = re.compile(r"``([A-Z]\w*)\.([A-Za-z_]\w*)(?:\(\))?``")


def _prose(path: Path, pattern: re.Pattern[str]) -> Iterator[tuple[int, tuple[str, ...]]]:
    """(line, groups) of every match of ``pattern`` in the module's docstrings and comments."""
    text = path.read_text()
    pieces: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node, clean=False)
        if doc is not None:
            pieces.append((node.body[0].lineno, doc))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            pieces.append((tok.start[0], tok.string))
    for line, piece in pieces:
        for m in pattern.finditer(piece):
            yield line + piece.count("\n", 0, m.start()), m.groups() or (m.group(),)


def _dotted_resolves(ref: str) -> bool:
    parts = ref.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            if not _has_member(obj, attr):
                return False
            obj = getattr(obj, attr, None)
        return True
    return False


def _class_members(tree: ast.Module) -> dict[str, tuple[set[str], list[str]]]:
    """Class name -> (names its body and its methods' ``self.x =`` define, its bases' names)."""
    out: dict[str, tuple[set[str], list[str]]] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.id if isinstance(node, ast.Name) else node.attr)
        bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in cls.bases]
        out.setdefault(cls.name, (set(), []))
        out[cls.name][0].update(names)
        out[cls.name][1].extend(bases)
    return out


ROUTER_CLASSES: dict[str, tuple[set[str], list[str]]] = {}
for _path in MODULES.values():
    for _cls, (_names, _bases) in _class_members(ast.parse(_path.read_text())).items():
        ROUTER_CLASSES.setdefault(_cls, (set(), []))
        ROUTER_CLASSES[_cls][0].update(_names)
        ROUTER_CLASSES[_cls][1].extend(_bases)


def _router_class_has(cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
    if cls not in ROUTER_CLASSES or cls in seen:
        return False
    names, bases = ROUTER_CLASSES[cls]
    return member in names or any(_router_class_has(b, member, seen | {cls}) for b in bases)


def _has_member(obj: object, member: str) -> bool:
    if hasattr(obj, member):
        return True
    annotated = (getattr(k, "__annotations__", {}) for k in getattr(obj, "__mro__", ()))
    return any(member in a for a in annotated) or (
        isinstance(obj, type) and _router_class_has(obj.__name__, member)
    )


def _member_resolves(module: str, cls: str, member: str) -> bool:
    # The name as the module sees it (an import of a library's class), else a router class.
    here = getattr(importlib.import_module(module), cls, None)
    if isinstance(here, type):
        return _has_member(here, member)
    return _router_class_has(cls, member)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_docstring_and_comment_reference_resolves(name: str) -> None:
    """``router.x.y[.Name]`` is a module (and a name in it); ``Class.member`` is a member."""
    path = MODULES[name]
    where = path.relative_to(ROOT)
    broken = [
        f"{where}:{line}: {ref}"
        for line, (ref,) in _prose(path, DOTTED_REF)
        if not _dotted_resolves(ref)
    ] + [
        f"{where}:{line}: {cls}.{member}"
        for line, (cls, member) in _prose(path, MEMBER_REF)
        if not _member_resolves(name, cls, member)
    ]
    assert broken == [], "references to names that do not exist: " + "; ".join(broken)


def test_only_the_runtime_the_app_and_the_exchange_import_the_wiring() -> None:
    # The composition root builds everything; below it, nothing may reach back up into it.
    # The exchange takes its ``Services`` record from there, and imports nothing else of it;
    # so does the endpoint picker, the exchange's counterpart for Envoy.
    wiring = f"{GATEWAY}.wiring"
    allowed = {f"{GATEWAY}.app", f"{GATEWAY}.exchange"}
    picker = f"{GATEWAY}.extproc"
    for name in MODULES:
        within = any(_within(name, p) for p in (f"{GATEWAY}.runtime", picker))
        if within or name in allowed or name == wiring:
            continue
        assert wiring not in imports(name), f"{name} imports the wiring"
