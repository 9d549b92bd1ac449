"""Per-student feedback (Markdown) and the summary table, both from gradebook rows."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from course_utils.instructor.gradebook import PASSED, Row, _format
from course_utils.instructor.submissions import safe_name

__all__ = ["student_markdown", "summary_table", "write_feedback"]

_ICONS = {PASSED: "✅", "not attempted": "⏳"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def student_markdown(student: str, rows: list[Row]) -> str:
    """The feedback page of one student: a table per notebook and the total."""
    lines = [f"# Feedback for {student}", ""]
    by_notebook: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_notebook[row.notebook].append(row)
    total = maximum = 0.0
    for notebook, items in sorted(by_notebook.items()):
        got = sum(r.points for r in items)
        out_of = sum(r.max_points for r in items)
        total, maximum = total + got, maximum + out_of
        lines += [f"## {notebook}: {_format(got)} / {_format(out_of)}", "",
                  "| exercise | points | status | feedback |", "| --- | --- | --- | --- |"]
        for r in items:
            icon = _ICONS.get(r.status, "❌")
            lines.append(f"| {_cell(r.exercise) or '–'} | {_format(r.points)} / "
                         f"{_format(r.max_points)} | {icon} {r.status} | {_cell(r.feedback)} |")
        lines.append("")
    lines.append(f"**Total: {_format(total)} / {_format(maximum)}**")
    return "\n".join(lines) + "\n"


def write_feedback(rows: list[Row], directory: Path) -> list[Path]:
    """Write ``<directory>/<safe student name>.md`` for every student in ``rows``."""
    directory.mkdir(parents=True, exist_ok=True)
    by_student: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_student[row.student].append(row)
    written = []
    for student, items in sorted(by_student.items()):
        path = directory / f"{safe_name(student)}.md"
        path.write_text(student_markdown(student, items), encoding="utf-8")
        written.append(path)
    return written


def summary_table(rows: list[Row]) -> str:
    """Per notebook: submissions, mean score and how many checks ended in each status."""
    by_notebook: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_notebook[row.notebook].append(row)
    statuses = sorted({r.status for r in rows}, key=lambda s: (s != PASSED, s))
    header = ["notebook", "students", "mean points", *statuses]
    table = [header]
    for notebook, items in sorted(by_notebook.items()):
        students = {r.student for r in items}
        got = sum(r.points for r in items) / max(1, len(students))
        out_of = max((sum(r.max_points for r in items if r.student == s) for s in students),
                     default=0.0)
        counts = Counter(r.status for r in items)
        table.append([notebook, str(len(students)), f"{got:.2f} / {_format(out_of)}",
                      *(str(counts.get(s, 0)) for s in statuses)])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(value.ljust(w) for value, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
