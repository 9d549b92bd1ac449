"""No import circle among the modules of ``course_utils`` (read statically, with ``ast``).

Every ``import`` counts, also one inside a function: a deferred import still makes one module
depend on the other at run time, it only hides the circle from Python until the function runs
(``environment.setup`` importing ``devices`` while ``devices`` imported ``environment`` was such
a circle). Imports under ``if TYPE_CHECKING:`` never run and do not count. The package's lazy
front door (``course_utils.__getattr__`` loading submodules by name with ``importlib``) is no
``import`` statement, so it is aside by construction.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Every module of ``package`` (a folder under ``root``) by dotted name."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (``from P import m`` counts as P.m)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:  # import a.b.c where c is a name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: one list of modules per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def test_course_utils_has_no_import_circle():
    graph = import_graph(REPO, "course_utils")
    assert "course_utils.devices" in graph and len(graph) > 10  # the walk found the package
    cycles = import_cycles(graph)
    assert not cycles, "import circles in course_utils (module -> the modules it imports): " + \
        "; ".join(", ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles)


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


@pytest.mark.parametrize(("files", "expected"), [
    pytest.param({"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import x\n",
                  "pkg/b.py": "def f():\n    from pkg import a\n"},
                 [["pkg.a", "pkg.b"]], id="inside-a-function"),
    pytest.param({"pkg/__init__.py": "", "pkg/a.py": "from . import b\n",
                  "pkg/b.py": "import pkg.sub.c\n", "pkg/sub/__init__.py": "",
                  "pkg/sub/c.py": "from ..a import name\n"},
                 [["pkg.a", "pkg.b", "pkg.sub.c"]], id="relative-three-modules"),
    pytest.param({"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import x\n",
                  "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg.a import y\n"},
                 [], id="type-checking-only"),
    pytest.param({"pkg/__init__.py": "import importlib\n"
                                     "def __getattr__(n):\n    return importlib.import_module(n)\n",
                  "pkg/a.py": "import pkg\nfrom pkg.b import x\n", "pkg/b.py": "import os\n"},
                 [], id="lazy-front-door"),
])
def test_import_cycles_are_found_in_a_synthetic_package(tmp_path, files, expected):
    _write(tmp_path, files)
    assert import_cycles(import_graph(tmp_path, "pkg")) == expected


def test_the_old_devices_environment_circle_would_be_found(tmp_path):
    _write(tmp_path, {
        "course_utils/__init__.py": "",
        "course_utils/devices.py": "from course_utils.environment import import_tensorflow\n",
        "course_utils/environment.py": "def setup():\n    from course_utils import devices\n",
    })
    graph = import_graph(tmp_path, "course_utils")
    assert import_cycles(graph) == [["course_utils.devices", "course_utils.environment"]]
