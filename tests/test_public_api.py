"""The public face of ``course_utils``: ``__all__`` everywhere, and notebooks use only it.

A name is public in a module when it is in the module's ``__all__``, or when the module's lazy
front door (``__getattr__``/``__dir__``, as ``course_utils.grading`` has for ``check_*``)
advertises it in ``dir()`` without it being a global there.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import pkgutil

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

import course_utils

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions", "exercises")
                   for p in (REPO / folder).glob("*.ipynb"))
#: Modules whose every public-looking definition must be in ``__all__`` (the other modules,
#: training, cluster and grading, keep their own lists).
EXACT_MODULES = ("bench", "data", "devices", "environment", "models", "monitor", "notebooks",
                 "plots", "quiet", "strategies")
CONSTANTS = {"COURSE_BRANCH", "COURSE_REPO"}


def all_modules() -> list[str]:
    """Every importable module of the package (``__main__`` aside)."""
    names = ["course_utils"]
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


def is_module(name: str) -> bool:
    """True when ``name`` is a module or package (found without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def public_names(module_name: str) -> set[str] | None:
    """The public names of a module (``None`` when it has no ``__all__``)."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "__all__"):
        return None
    advertised = set(dir(module)) - set(vars(module)) if hasattr(module, "__getattr__") else set()
    return {n for n in {*module.__all__, *advertised} if not n.startswith("_")}


def check_path(module: str, names: list[str], where: str) -> list[str]:
    """Problems with reaching ``module.names[0].names[1]...``; stops at the first non-module."""
    reached = module
    for name in names:
        if name.startswith("__") and name.endswith("__"):  # __version__, __doc__: fine
            return []
        if name.startswith("_"):
            return [f"{where}: {reached}.{name} is private"]
        if module:  # past the last module only private names are checked
            public = public_names(module)
            if public is None:
                return [f"{where}: {module} has no __all__"]
            if name not in public:
                return [f"{where}: {module}.{name} is not in {module}.__all__"]
            module = f"{module}.{name}" if is_module(f"{module}.{name}") else ""
        reached = f"{reached}.{name}"
    return []


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return (node.id, names[::-1]) if isinstance(node, ast.Name) else None


def public_api_problems(sources: list[str], label: str = "notebook") -> list[str]:
    """Every use of a non-public ``course_utils`` name in ``sources`` (a notebook's code cells)."""
    problems: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the course_utils module it stands for
    transform = TransformerManager().transform_cell
    for source, where in _with_written_scripts(sources, label):
        try:
            tree = ast.parse(transform(source))
        except SyntaxError as error:
            problems.append(f"{where}: does not parse ({error.msg})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    root, *path = alias.name.split(".")
                    if root != "course_utils":
                        continue
                    problems += check_path("course_utils", path, where)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases["course_utils"] = "course_utils"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module.split(".")[0] == "course_utils"):
                root, *path = node.module.split(".")
                problems += check_path("course_utils", path, where)
                for alias in node.names:
                    if alias.name != "*":
                        problems += check_path(node.module, [alias.name], where)
                        if is_module(f"{node.module}.{alias.name}"):
                            aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            chain = _chain(node) if isinstance(node, ast.Attribute) else None
            if chain and chain[0] in aliases:
                problems += check_path(aliases[chain[0]], chain[1], where)
    return list(dict.fromkeys(problems))


def _with_written_scripts(sources: list[str], label: str) -> list[tuple[str, str]]:
    """The cells to check, with each Python file a ``%%writefile`` cell writes (whole, ``-a``
    parts joined) as a source of its own: a worker script is notebook code too."""
    cells, scripts = [], {}
    for number, source in enumerate(sources, 1):
        first, _, body = source.partition("\n")
        words = first.split()
        if words[:1] == ["%%writefile"] and words[-1].endswith(".py"):
            append = "-a" in words[1:-1] or "--append" in words[1:-1]
            scripts[words[-1]] = (scripts.get(words[-1], "") if append else "") + body + "\n"
            continue
        cells.append((source, f"{label} code cell {number}"))
    return cells + [(text, f"{label} script {name} (%%writefile)")
                    for name, text in scripts.items()]


def notebook_sources(path: pathlib.Path) -> list[str]:
    """The code cells of a notebook."""
    notebook = nbformat.read(path, as_version=4)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


# --- the package ---------------------------------------------------------------------------

def test_the_package_exports_its_submodules_reexports_and_constants():
    expected = {*course_utils._SUBMODULES, *course_utils._EXPORTS, *CONSTANTS}
    assert sorted(course_utils.__all__) == sorted(expected)
    assert set(course_utils._SUBMODULES) == {
        name.split(".")[1] for name in all_modules() if name.count(".") == 1}


def test_every_name_the_package_exports_resolves():
    for name in course_utils.__all__:
        assert getattr(course_utils, name) is not None, name
    for name, module in course_utils._EXPORTS.items():
        assert name in importlib.import_module(f"course_utils.{module}").__all__, name


@pytest.mark.parametrize("module_name", [f"course_utils.{m}" for m in EXACT_MODULES])
def test_module_exports_exactly_its_public_definitions(module_name):
    module = importlib.import_module(module_name)
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    public = {name for name in defined if not name.startswith("_")}
    missing = public - set(module.__all__)
    assert not missing, f"public definitions missing from {module_name}.__all__: {missing}"


@pytest.mark.parametrize("module_name", all_modules())
def test_every_exported_name_exists_and_is_not_private(module_name):
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} declares no __all__"
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"
    for name in module.__all__:
        assert not name.startswith("_"), name
        assert hasattr(module, name), f"{module_name}.__all__ names {name}, which does not exist"


def test_importing_the_package_with_its_public_face_does_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, course_utils\nassert len(course_utils.__all__) > 10\n"
            "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=REPO)
    assert result.stdout.strip() == "False"


# --- the notebooks -------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_uses_only_public_names(path):
    sources = notebook_sources(path)
    assert any("course_utils" in source for source in sources)
    assert public_api_problems(sources, path.name) == []


@pytest.mark.parametrize(("source", "problem"), [
    ("import course_utils as cu\ncu.devices._tf()", "course_utils.devices._tf is private"),
    ("import course_utils as cu\ncu.setup()\ncu.nothing_here", "course_utils.nothing_here is not"),
    ("import course_utils as cu\ncu.data.not_a_name(1)", "course_utils.data.not_a_name is not"),
    ("import course_utils as cu\ncu.Trainer._run_step", "course_utils.Trainer._run_step is priv"),
    ("import course_utils as cu\ncu.grading.framework.Case",
     "course_utils.grading.framework is not in course_utils.grading.__all__"),
    ("from course_utils.devices import _version", "course_utils.devices._version is private"),
    ("from course_utils.data import _example", "course_utils.data._example is private"),
    ("from course_utils.grading.framework import Case",
     "course_utils.grading.framework is not in course_utils.grading.__all__"),
    ("import course_utils.grading.framework", "course_utils.grading.framework is not in"),
    ("import course_utils.data as d\nd._example", "course_utils.data._example is private"),
    ("from course_utils import bench as b\nb._human(1)", "course_utils.bench._human is private"),
    ("from course_utils import _EXPORTS", "course_utils._EXPORTS is private"),
    ("%matplotlib inline\nimport course_utils as c\nc.plots._axes", "plots._axes is private"),
    ("%%writefile w.py\nimport course_utils as cu\ncu.cluster._private()",
     "course_utils.cluster._private is private"),
], ids=lambda value: value.splitlines()[-1][:40] if "\n" in value else value[:40])
def test_a_synthetic_notebook_with_a_private_use_fails(tmp_path, source, problem):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    path = tmp_path / "synthetic.ipynb"
    nbformat.write(notebook, path)
    problems = public_api_problems(notebook_sources(path), path.name)
    assert any(problem in p for p in problems), problems


def test_a_synthetic_notebook_with_public_uses_passes(tmp_path):
    sources = ["import course_utils as cu\nimport numpy as np\nhw = cu.setup(logical_devices=2)",
               "cu.data.teacher_classification(8, 4)\ncu.grading.check_diagnose_step\n"
               "from course_utils.data import make_pipeline\nfrom course_utils import plots\n"
               "plots.PALETTE\ncu.Trainer.fit\ncu.__version__\nnp._private_is_not_ours",
               "!ls\n%time x = 1"]
    assert public_api_problems(sources) == []
