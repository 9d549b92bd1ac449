"""Notebook plumbing shared by the generator and the grader: nbgrader metadata, names, I/O.

Cell metadata follows nbgrader (schema 3): ``cell.metadata.nbgrader = {grade_id, solution,
grade, locked, points, schema_version}``. A *solution cell* has ``solution: true``; a *check
cell* is a code cell with ``grade: true`` and ``points``; a *locked* cell is restored from the
instructor's notebook by the grader.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat

__all__ = ["EXERCISE_SUFFIX", "NBGRADER_SCHEMA", "SOLUTION_SUFFIX", "check_cells", "dumps",
           "exercise_name", "grade_id", "is_check_cell", "is_locked_cell", "is_solution_cell",
           "nbgrader_meta", "notebook_key", "points", "read_notebook"]

NBGRADER_SCHEMA = 3
SOLUTION_SUFFIX = "_solutions"
EXERCISE_SUFFIX = "_exercises"
_NAME = re.compile(r"^(\d\d_[a-z0-9_]+?)(?:_solutions|_exercises)?$")
_COPY_SUFFIX = re.compile(r"(?:[ _-]*\(\d+\)|[ _-]+copy\d*|-checkpoint)+$", re.IGNORECASE)


def nbgrader_meta(cell: Any) -> dict[str, Any]:
    """The cell's nbgrader metadata, or an empty dict."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def grade_id(cell: Any) -> str | None:
    """The cell's nbgrader ``grade_id``, if any."""
    value = nbgrader_meta(cell).get("grade_id")
    return value if isinstance(value, str) and value else None


def is_solution_cell(cell: Any) -> bool:
    """A cell the learner writes in (``solution: true``)."""
    return bool(nbgrader_meta(cell).get("solution"))


def is_check_cell(cell: Any) -> bool:
    """A graded code cell (``grade: true``) that is not a solution cell."""
    meta = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def is_locked_cell(cell: Any) -> bool:
    """A code cell the grader restores from the instructor's notebook (``locked`` or a check)."""
    return cell.get("cell_type") == "code" and grade_id(cell) is not None and (
        bool(nbgrader_meta(cell).get("locked")) or is_check_cell(cell))


def check_cells(nb: Any) -> list[Any]:
    """The notebook's check cells, in order."""
    return [cell for cell in nb.cells if is_check_cell(cell) and grade_id(cell)]


def points(cell: Any) -> float:
    """Points of a check cell (0 when missing or not a number)."""
    value = nbgrader_meta(cell).get("points", 0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def notebook_key(file_name: str) -> str | None:
    """``NN_name`` for ``NN_name_solutions.ipynb``, ``NN_name_exercises (1).ipynb``, ...

    Copies saved by JupyterLab or a browser (``-Copy1``, `` (2)``) map to the same key. ``None``
    when the name does not look like a course notebook.
    """
    stem = file_name[:-6] if file_name.lower().endswith(".ipynb") else file_name
    stem = _COPY_SUFFIX.sub("", stem.strip()).strip().lower().replace("-", "_").replace(" ", "_")
    match = _NAME.match(stem)
    return match.group(1) if match else None


def exercise_name(key: str) -> str:
    """``00_setup`` -> ``00_setup_exercises.ipynb``."""
    return f"{key}{EXERCISE_SUFFIX}.ipynb"


def read_notebook(path: Path) -> Any:
    """Read a notebook as nbformat 4 (raises ``ValueError`` when it is not one)."""
    return nbformat.read(str(path), as_version=4)


def dumps(nb: Any) -> str:
    """The notebook as text, deterministic (sorted keys, one-space indent, final newline)."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"
