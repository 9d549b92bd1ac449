"""Build the notebook the grader runs: the submission with the instructor's cells put back.

Check cells and locked cells (the set-up cell) come from the solution notebook, matched by
nbgrader ``grade_id`` (or by cell id when a front end dropped the metadata). Whatever the
submission holds under those ids (edited, moved, duplicated) is dropped; each instructor cell
goes right after the nearest cell that precedes it in the solution notebook and is present in
the submission, so moved or deleted cells still get their checks. A check cell comes back with
its hidden tests (nbgrader's ``### BEGIN HIDDEN TESTS``), which the learner's copy lacks. Each
check cell is prefixed with a guard that imports ``course_utils.grading`` afresh from the
instructor's installation and turns strict mode on: rebinding ``cu``, patching the checks or
changing the environment in an earlier cell gains nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.instructor.cells import (
    grade_id,
    is_check_cell,
    is_locked_cell,
    points,
)
from course_utils.instructor.hidden_tests import strip_hidden_tests

__all__ = ["CHECK_MARKER", "GUARD", "CheckSpec", "Prepared", "guard_source", "prepare"]

#: The guard's last line: what follows it in a check cell is the instructor's check.
CHECK_MARKER = "# --- instructor's check ---"
GUARD = '''\
# --- inserted by the course grader: fresh checks, strict mode ---
import sys as _grader_sys
for _grader_name in [_n for _n in list(_grader_sys.modules)
                     if _n == "course_utils" or _n.startswith("course_utils.grading")]:
    del _grader_sys.modules[_grader_name]
_grader_sys.path.insert(0, {root!r})
try:
    import course_utils as cu
    import course_utils.grading
finally:
    _grader_sys.path.remove({root!r})
if not str(course_utils.grading.__file__).startswith({package!r}):
    raise RuntimeError("grader: course_utils.grading was replaced by the submission")
cu = _grader_sys.modules["course_utils"]
cu.grading.set_strict(True)
# --- instructor's check ---
'''


@dataclass
class CheckSpec:
    """One graded check of the prepared notebook."""

    grade_id: str
    points: float
    cell_index: int
    note: str = ""


@dataclass
class Prepared:
    """The notebook to execute, its checks, and notes on what was restored."""

    notebook: Any
    checks: list[CheckSpec]
    notes: list[str] = field(default_factory=list)


def guard_source(package_dir: Path) -> str:
    """The guard prepended to every check cell."""
    package_dir = package_dir.resolve()
    return GUARD.format(root=str(package_dir.parent), package=str(package_dir))


def _key(cell: Any, ids_to_grade: dict[str, str]) -> str | None:
    gid = grade_id(cell)
    if gid:
        return gid
    cell_id = cell.get("id")
    return ids_to_grade.get(cell_id) if isinstance(cell_id, str) else None


def _anchor(cell: Any, ids_to_grade: dict[str, str]) -> tuple[str, Any] | None:
    """Where a cell stands in the solution: its grade id, else a code cell's own id.

    Markdown defines nothing, so it anchors nothing: a restored cell never waits for prose.
    """
    key = _key(cell, ids_to_grade)
    if key:
        return ("grade", key)
    return ("cell", cell.get("id")) if cell.get("cell_type") == "code" else None


def _clean(cell: Any) -> Any:
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    return cell


def prepare(submission: Any, solution: Any, package_dir: Path) -> Prepared:
    """The notebook to grade for ``submission`` against the instructor's ``solution``."""
    guard = guard_source(package_dir)
    instructor = [cell for cell in solution.cells if grade_id(cell)]
    ids_to_grade = {c.get("id"): grade_id(c) for c in instructor if isinstance(c.get("id"), str)}
    restored = {grade_id(c): c for c in instructor if is_locked_cell(c)}
    order = [grade_id(c) for c in instructor]
    # Every code cell of the solution, graded or not, in order: a locked cell goes back after
    # the cells that precede it there (the set-up cell, then the parameters cell, then a locked
    # cell that uses the parameters).
    solution_order = [_anchor(c, ids_to_grade) for c in solution.cells]

    submitted: dict[str, Any] = {}
    cells: list[tuple[str | None, Any]] = []
    anchors_of: list[tuple[str, Any]] = []  # beside ``cells``: each cell's place in the solution
    for cell in submission.cells:
        key = _key(cell, ids_to_grade)
        if key in restored:
            submitted.setdefault(key, cell)
            continue
        if is_check_cell(cell):  # a check the solution does not have: not run
            continue
        cells.append((key if key in ids_to_grade.values() else None, _clean(cell)))
        anchors_of.append(_anchor(cell, ids_to_grade))

    notes = []
    for key in order:
        if key not in restored:
            continue
        original = restored[key]
        if key not in submitted:
            notes.append(f"cell {key!r} was missing: the instructor's copy was put back")
        elif submitted[key].get("source", "") not in (original.source,
                                                       strip_hidden_tests(original.source)):
            notes.append(f"cell {key!r} was edited: the instructor's copy was put back")
        anchors = solution_order[:solution_order.index(("grade", key))]
        rank = {anchor: n for n, anchor in enumerate(anchors) if anchor is not None}
        present = [i for i, anchor in enumerate(anchors_of) if anchor in rank]
        where = 0
        if present:  # after the last present cell among those preceding it in the solution
            best = max(present, key=lambda i: (rank[anchors_of[i]], i))
            where = best + 1
        cells.insert(where, (key, _clean(original)))
        anchors_of.insert(where, ("grade", key))

    nb = copy.deepcopy(submission)
    nb.cells = [cell for _, cell in cells]
    checks = []
    for index, (key, cell) in enumerate(cells):
        if key in restored and is_check_cell(restored[key]):
            cell.source = guard + restored[key].source
            checks.append(CheckSpec(key, points(restored[key]), index))
    for key in order:
        if key in restored or any(k == key for k, _ in cells):
            continue
        notes.append(f"cell {key!r} was missing from the submission")
    return Prepared(nb, checks, notes)
