"""No module of jointspace_train imports another that imports it back, directly or through others.

The graph is read from the source with `ast`, not by importing it: every `import` and `from ... import` anywhere
in a module (at the top, inside a function, under `if TYPE_CHECKING:`), relative or absolute, that names a module
of the package. `from . import x` counts as importing the submodule `x` when there is one, else the package.
A cycle fails the test with the modules and the lines that close it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jointspace_train"


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `root` (a package is its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a module of the package."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def imports(name: str, known: dict[str, Path]) -> dict[str, int]:
    """The package's modules that module `name` imports, each with the line of its first such import."""
    path = known[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [_known(a.name, known) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [_known(f"{module}.{a.name}", known) or _known(module, known) for a in node.names]
        else:
            continue
        for t in targets:
            if t is not None and t != name:
                found[t] = min(found.get(t, node.lineno), node.lineno)
    return found


def graph(root: Path) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    known = modules(root)
    return {m: imports(m, known) for m in known}, known


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_cycle_in(sorted(g), edges) for g in groups]


def _cycle_in(group: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest path from the group's first module back to itself, within the group (breadth first)."""
    start, inside = group[0], set(group)
    came: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while came[path[-1]] is not None:
                        path.append(came[path[-1]])
                    return path[::-1] + [start]
                if w in inside and w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{group} is not strongly connected")


def describe(cycle: list[str], edges: dict[str, dict[str, int]], known: dict[str, Path],
             root: Path | None = None) -> str:
    top = (root or PACKAGE).parent
    steps = [f"{a} -> {b} ({known[a].relative_to(top)}:{edges[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n    " + "\n    ".join(steps)


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    edges, known = graph(PACKAGE)
    assert len(known) > 10, f"found only {sorted(known)} under {PACKAGE}"
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(c, edges, known) for c in found)


def test_the_library_never_imports_the_command_line():
    """cli/ turns arguments into settings objects and calls the library; nothing but the entry point (__main__)
    imports cli/, so the library's logic cannot drift back behind it."""
    edges, known = graph(PACKAGE)
    cli = "jointspace_train.cli"

    def in_cli(m: str) -> bool:
        return m == cli or m.startswith(cli + ".")

    back = [f"{m} -> {t} ({known[m].relative_to(PACKAGE.parent)}:{line})" for m, ts in sorted(edges.items())
            if not in_cli(m) and m != "jointspace_train.__main__" for t, line in sorted(ts.items()) if in_cli(t)]
    assert not back, "the library imports the command line:\n" + "\n".join(back)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize("b, a_imports_b, lazy", [
    ("b", "from . import b", "from . import a"),
    ("b", "from .b import f", "from .a import X"),
    ("b", "from . import b", "from pkg.a import X"),
    ("b", "import pkg.b", "import pkg.a"),
    ("b", "from . import b", "from pkg import a"),
    ("sub.b", "from .sub import b", "from .. import a"),
    ("sub.b", "from .sub.b import f", "from ..a import X"),
])
def test_the_check_sees_a_cycle_closed_inside_a_function(tmp_path, b, a_imports_b, lazy):
    """The check itself: a imports b at its top, b imports a back only inside a function, in each spelling."""
    pkg = _write(tmp_path, {"pkg/__init__.py": "", "pkg/sub/__init__.py": "",
                            "pkg/a.py": f"{a_imports_b}\nX = 1\n",
                            f"pkg/{b.replace('.', '/')}.py": f"def f():\n    {lazy}\n    return X\n"})
    edges, known = graph(pkg)
    assert cycles(edges) == [["pkg.a", f"pkg.{b}", "pkg.a"]]
    assert f"pkg.{b} -> pkg.a" in describe(cycles(edges)[0], edges, known, pkg)


def test_an_acyclic_package_with_a_dispatching_init_passes(tmp_path):
    """A package whose __init__ imports its submodules, which import a shared sibling: no cycle."""
    pkg = _write(tmp_path, {"pkg/__init__.py": "from .b import one\n",
                            "pkg/b/__init__.py": "from . import one, two\n",
                            "pkg/b/common.py": "OPSET = 17\n",
                            "pkg/b/one.py": "from .common import OPSET\n",
                            "pkg/b/two.py": "def f():\n    from . import common\n    return common\n"})
    edges, _ = graph(pkg)
    assert edges["pkg"] == {"pkg.b.one": 1}
    assert edges["pkg.b"] == {"pkg.b.one": 1, "pkg.b.two": 1}
    assert edges["pkg.b.two"] == {"pkg.b.common": 2}
    assert cycles(edges) == []
