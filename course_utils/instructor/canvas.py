"""A Canvas gradebook import from our CSV gradebook: one column per notebook, points out of
its total, in the layout Canvas's "Import" (Grades → Import) reads.

Canvas matches learners by its own IDs: the ``SIS Login ID`` column holds each student folder's
name, so name the submission folders by Canvas login ID (or fill the ``ID`` column in by hand).
Each notebook column is a new assignment for Canvas unless one of that name exists; the second
row, "Points Possible", gives each assignment's total.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from course_utils.instructor.gradebook import read_rows

__all__ = ["CANVAS_COLUMNS", "canvas_rows", "write_canvas_csv"]

#: The identity columns Canvas's gradebook import expects before the assignment columns.
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")


def _assignment(notebook: str) -> str:
    """``03_multi_worker_exercises.ipynb`` -> ``03 multi worker``."""
    return notebook.removesuffix(".ipynb").removesuffix("_exercises").replace("_", " ")


def canvas_rows(gradebook: Path) -> list[list[str]]:
    """The Canvas CSV as rows: header, "Points Possible", then one row per student."""
    points: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    totals: dict[str, float] = defaultdict(float)
    for row in read_rows(gradebook):
        if not row.student or not row.exercise:  # stray files, unknown notebooks: not grades
            continue
        name = _assignment(row.notebook)
        points[row.student][name] += row.points
        totals[(name, row.student)] += row.max_points
    assignments = sorted({name for grades in points.values() for name in grades})
    possible = {name: max(total for (n, _), total in totals.items() if n == name)
                for name in assignments}
    rows = [[*CANVAS_COLUMNS, *assignments],
            ["Points Possible", "", "", "", "", *(f"{possible[a]:g}" for a in assignments)]]
    for student in sorted(points):
        rows.append([student, "", "", student, "",
                     *(f"{points[student][a]:g}" if a in points[student] else ""
                       for a in assignments)])
    return rows


def write_canvas_csv(gradebook: Path, out: Path) -> Path:
    """Write the Canvas import of ``gradebook`` to ``out``; return ``out``."""
    if not gradebook.is_file():
        raise FileNotFoundError(f"{gradebook} does not exist: grade a class first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(canvas_rows(gradebook))
    return out
