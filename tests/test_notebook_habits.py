"""What every lesson, solution and exercise shows a learner, read from the notebooks' code:

- results as tables, never as text tables: no ``format_table``/``to_string``/``tabulate``, and no
  ``print`` of an f-string padded to a width (``{name:<16}``, ``{seconds:7.2f}``), which only
  serves to line up columns that wrap in a narrow pane; ``cu.show_table`` displays them;
- no private TensorFlow or Keras module (``tensorflow.python``, ``keras.src``) and no private
  attribute (``model._name``) of any object the notebook did not define itself.

Each rule is proven able to fail on a planted violation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from test_public_api import NOTEBOOKS, _with_written_scripts, notebook_sources

#: Text-table makers: the course's old one and the usual libraries'.
TEXT_TABLE_CALLS = {"format_table", "to_string", "tabulate", "to_markdown"}
#: A format spec that pads to a width: optional fill and alignment, then digits ("<16", "7.2f",
#: "8,.0f", ">9,", "24s"); a zero fill ("02d", "05.1f") pads numbers, not columns.
PADDED = re.compile(r"^(.?[<>^=])?[+\- ]?#?(?!0)\d+")
#: Private modules of TensorFlow and Keras, however they are reached.
REPO_SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"
PRIVATE_MODULES = re.compile(r"\b(tensorflow\.python|tensorflow\.core|tensorflow\._api|"
                             r"keras\.src|keras\._tf_keras|tf_keras\.src)\b")


def _code_units(sources: list[str], label: str) -> list[tuple[ast.AST, str]]:
    """Each cell and ``%%writefile`` script, parsed after IPython's transforms."""
    transform = TransformerManager().transform_cell
    units = []
    for source, where in _with_written_scripts(sources, label):
        try:
            units.append((ast.parse(transform(source)), where))
        except SyntaxError as error:
            units.append((ast.parse(""), f"{where}: does not parse ({error.msg})"))
    return units


def _padded_fields(node: ast.JoinedStr) -> list[str]:
    specs = []
    for value in node.values:
        if isinstance(value, ast.FormattedValue) and value.format_spec is not None:
            spec = "".join(part.value for part in value.format_spec.values
                           if isinstance(part, ast.Constant))
            if PADDED.match(spec):
                specs.append(spec)
    return specs


def text_table_problems(sources: list[str], label: str = "notebook") -> list[str]:
    """Every text table a notebook prints (see the module's docstring)."""
    problems = []
    for tree, where in _code_units(sources, label):
        if "does not parse" in where:
            problems.append(where)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            if name in TEXT_TABLE_CALLS:
                problems.append(f"{where}: {name}(...) makes a text table: use cu.show_table")
            elif name == "print":
                for argument in node.args:
                    for string in (n for n in ast.walk(argument) if isinstance(n, ast.JoinedStr)):
                        for spec in _padded_fields(string):
                            problems.append(f"{where}: print pads a field to a width (:{spec}), "
                                            "a text table: use cu.show_table")
    return list(dict.fromkeys(problems))


def private_api_problems(sources: list[str], label: str = "notebook") -> list[str]:
    """Private TensorFlow/Keras modules and private attributes a notebook reaches for."""
    problems = []
    for source, where in _with_written_scripts(sources, label):
        for match in PRIVATE_MODULES.finditer(source):
            problems.append(f"{where}: uses the private module {match.group(0)}")
    for tree, where in _code_units(sources, label):
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") and node.attr.endswith("__"):
                continue  # __name__, __class__, __version__: public by convention
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in {"self", "cls"} | defined):
                continue  # the notebook's own class, written in front of the learner
            problems.append(f"{where}: reads the private attribute .{node.attr}")
    return list(dict.fromkeys(problems))


def _ids(path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_shows_results_as_tables_not_text(path):
    assert text_table_problems(notebook_sources(path), path.name) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_uses_no_private_tensorflow_or_keras_api(path):
    assert private_api_problems(notebook_sources(path), path.name) == []


def _notebook(tmp_path, *sources: str) -> list[str]:
    path = tmp_path / "planted.ipynb"
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return notebook_sources(path)


@pytest.mark.parametrize("source", [
    "print(cu.bench.format_table(rows))",
    "print(frame.to_string())",
    "for name, s in times.items():\n    print(f'{name:<16}{s:7.2f} ms')",
    "print(f\"{'total':24s} {total / 2**20:8.2f} MiB\")",
    "print(f'{n:>9,} floats')",
    "print('x', f'{value:10.3g}')",
])
def test_a_planted_text_table_fails(tmp_path, source):
    assert text_table_problems(_notebook(tmp_path, source))


@pytest.mark.parametrize("source", [
    "cu.show_table(rows)",
    "print(f'{speedup:.2f}x faster, {share:.0%} of the step, step {step:02d}')",
    "print(f'loss {loss:.3f}')",
    "%%writefile worker.py\nprint(f'step {step}')",
])
def test_prose_prints_and_show_table_pass(tmp_path, source):
    assert text_table_problems(_notebook(tmp_path, source)) == []


@pytest.mark.parametrize("source", [
    "from tensorflow.python.distribute import input_ops",
    "import keras.src.backend as b",
    "model = keras.Sequential()\nprint(model._name)",
    "optimizer._iterations.assign(0)",
    "%%writefile worker.py\nfrom tensorflow.python.eager import context",
    "%%writefile worker.py\nprint(strategy._extended)",
    "loss = layer._keras_logits",
])
def test_a_planted_private_api_fails(tmp_path, source):
    assert private_api_problems(_notebook(tmp_path, source))


@pytest.mark.parametrize("source", [
    "class Stage:\n    def __init__(self):\n        self._cache = {}\n    def run(self):\n"
    "        return self._cache",
    "print(tf.__version__, type(model).__name__)",
    "strategy.extended.worker_devices",
])
def test_public_apis_and_own_classes_pass(tmp_path, source):
    assert private_api_problems(_notebook(tmp_path, source)) == []


#: The longest code line the book shows without a horizontal scroll bar (sphinx-book-theme's
#: article column at its default font size); a learner's narrow JupyterLab pane agrees.
MAX_CODE_LINE = 88


def long_code_lines(sources: list[str]) -> list[str]:
    """Each code line longer than ``MAX_CODE_LINE`` characters, with its cell and line."""
    return [f"cell {cell} line {number}: {len(line)} characters"
            for cell, source in enumerate(sources)
            for number, line in enumerate(source.splitlines(), 1) if len(line) > MAX_CODE_LINE]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_code_lines_fit_the_book_without_scrolling(path):
    problems = long_code_lines(notebook_sources(path))
    assert not problems, f"{_ids(path)}: shorten these lines to {MAX_CODE_LINE}: {problems}"


def test_a_planted_long_line_fails():
    assert long_code_lines(["x = 1\n" + "y = " + "1 + " * 30 + "1"]) == [
        "cell 0 line 2: 125 characters"]


@pytest.mark.parametrize("path", sorted(REPO_SOLUTIONS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_solution_cells_end_where_nbgrader_ends_them(path):
    """nbgrader's release keeps a solution cell's trailing newline; our exercise generator does
    not: a cell ending in one makes the two releases differ (a test of the nbgrader run compares
    them, at much greater cost)."""
    notebook = nbformat.read(path, as_version=4)
    ending = [cell.id for cell in notebook.cells
              if cell.cell_type == "code" and "### END SOLUTION" in cell.source
              and cell.source.endswith("\n")]
    assert not ending, f"{path.name}: cells {ending} end in a newline"
