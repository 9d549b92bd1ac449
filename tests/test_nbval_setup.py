"""nbval as the Makefile runs it: a working notebook passes, a broken one fails clearly."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _notebook(path: pathlib.Path, *sources: str) -> pathlib.Path:
    cells = [nbformat.v4.new_code_cell(source, id=f"cell-{i}") for i, source in enumerate(sources)]
    notebook = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, str(path))
    return path


def _nbval(*paths: pathlib.Path) -> subprocess.CompletedProcess:
    """Run nbval as the Makefile does, with the repository's conftest.py, beside the notebooks."""
    folder = paths[0].parent
    shutil.copy(REPO / "conftest.py", folder / "conftest.py")
    (folder / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
               "--nbval-cell-timeout=60", "-p", "no:cacheprovider", "-v", "--color=no",
               *(path.name for path in paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder)


@pytest.mark.slow
def test_broken_notebook_fails_naming_the_cell_and_error_while_good_one_passes(tmp_path):
    good = _notebook(tmp_path / "good.ipynb", "import sys\nprint('hi', file=sys.stderr)",
                     "x = 41 + 1\nassert x == 42")
    broken = _notebook(tmp_path / "broken.ipynb", "x = 1", "assert x == 2, 'x should be two'",
                       "print('never reached')")
    result = _nbval(good, broken)
    assert result.returncode == 1, result.stdout
    assert "good::ipynb::Cell 1 PASSED" in result.stdout
    assert "FAILED broken.ipynb::Cell 1 - Notebook cell execution failed" in result.stdout
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # the kernel colours tracebacks
    assert "AssertionError: x should be two" in traceback


@pytest.mark.slow
def test_stderr_is_not_compared_even_where_outputs_are(tmp_path):
    notebook = nbformat.v4.new_notebook(metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    cell = nbformat.v4.new_code_cell(
        "import sys\nprint('same')\nprint('noise that differs', file=sys.stderr)", id="c0",
        metadata={"tags": ["nbval-check-output"]})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="same\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="other noise\n")]
    cell.execution_count = 1
    notebook.cells = [cell]
    path = tmp_path / "compared.ipynb"
    nbformat.write(notebook, str(path))
    result = _nbval(path)
    assert result.returncode == 0, result.stdout
