"""The CSV gradebook: one row per student, notebook and exercise, appended and flushed."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from dataclasses import astuple, dataclass
from pathlib import Path

__all__ = ["COLUMNS", "DUPLICATE", "ERROR", "FAILED", "GRADER_ERROR", "INVALID", "KERNEL_DIED",
           "NOT_ATTEMPTED", "PASSED", "STRAY", "TAMPERED", "TIMEOUT", "UNGRADABLE", "UNKNOWN",
           "Gradebook", "Row", "read_rows"]

COLUMNS = ("student", "notebook", "exercise", "points", "max_points", "status", "feedback")

PASSED = "passed"
FAILED = "failed"
ERROR = "error"
NOT_ATTEMPTED = "not attempted"
TIMEOUT = "timeout"
KERNEL_DIED = "kernel died"
TAMPERED = "tampered"
INVALID = "invalid notebook"
UNKNOWN = "unknown notebook"
STRAY = "no student folder"
DUPLICATE = "duplicate"
GRADER_ERROR = "grader error"
#: Statuses that mean a submission could not be graded at all (nonzero exit status).
UNGRADABLE = frozenset({INVALID, UNKNOWN, STRAY, GRADER_ERROR})


@dataclass
class Row:
    """One gradebook row."""

    student: str
    notebook: str
    exercise: str
    points: float
    max_points: float
    status: str
    feedback: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """(student, notebook): the unit the grader grades and resumes by."""
        return (self.student, self.notebook)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def read_rows(path: Path) -> list[Row]:
    """Rows of an existing gradebook (a half-written last line from a killed run is ignored)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    rows = []
    for record in csv.DictReader(io.StringIO(text, newline="")):
        if None in record.values() or record.get("student") is None:
            continue
        rows.append(Row(record["student"], record["notebook"], record["exercise"],
                        _number(record["points"]), _number(record["max_points"]),
                        record["status"], record["feedback"]))
    return rows


class Gradebook:
    """Append-only CSV writer: each ``add`` is written, flushed and synced at once. The file is
    readable by its owner only, and the writer keeps a copy of what it wrote: ``changed()``
    tells when someone else changed the file, ``restore()`` puts the writer's copy back."""

    def __init__(self, path: Path, drop_keys: set[tuple[str, str]] | None = None) -> None:
        self.path = path
        self._written = b""
        path.parent.mkdir(parents=True, exist_ok=True)
        if drop_keys:  # --force: rewrite without the rows about to be graded again
            keep = [row for row in read_rows(path) if row.key not in drop_keys]
            self._rewrite(keep)
        elif path.exists() and path.stat().st_size:
            rows = read_rows(path)  # also drops a half-written last line
            raw = path.read_text(encoding="utf-8", errors="replace")
            if not raw.startswith(",".join(COLUMNS)) or not raw.endswith("\n"):
                self._rewrite(rows)
        else:
            self._rewrite([])
        if not self._written:
            self._written = self.path.read_bytes()
        if self.path.stat().st_mode & 0o077:
            self.path.chmod(0o600)

    def _rewrite(self, rows: list[Row]) -> None:
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(self._record(row) for row in rows)
        self._replace(buffer.getvalue().encode("utf-8"))

    def _replace(self, data: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self._written = data

    def changed(self) -> bool:
        """True when the file no longer holds exactly what this writer wrote."""
        try:
            return self.path.read_bytes() != self._written
        except OSError:
            return True

    def restore(self) -> None:
        """Write this writer's copy back over whatever the file holds now."""
        self._replace(self._written)

    @staticmethod
    def _record(row: Row) -> tuple[str, ...]:
        values = list(astuple(row))
        values[3], values[4] = _format(row.points), _format(row.max_points)
        return tuple(str(v) for v in values)

    def add(self, rows: list[Row]) -> None:
        """Append ``rows`` in one write, then flush and fsync."""
        buffer = io.StringIO(newline="")
        csv.writer(buffer, lineterminator="\n").writerows(self._record(row) for row in rows)
        data = buffer.getvalue().encode("utf-8")
        with self.path.open("ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        self._written += data
