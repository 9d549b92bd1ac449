"""Reading what the grader grades: the submissions (``SUBMISSIONS/<student>/<notebook>.ipynb``
or nbgrader's ``submitted/<student>/<assignment>/<notebook>.ipynb``), each one's notebook (or why
it cannot be read), safe file names for student names, and the solution notebooks."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from course_utils.instructor.cells import (
    SOLUTION_SUFFIX,
    check_cells,
    exercise_name,
    grade_id,
    notebook_key,
    points,
    read_notebook,
)

__all__ = ["Solution", "Submission", "find_submissions", "load_solutions", "pick_latest",
           "read_submission", "safe_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Submission:
    """One submitted notebook: who, which file, and which course notebook it answers."""

    student: str
    path: Path
    key: str | None  # NN_name of the course notebook, None when the name does not match

    @property
    def notebook(self) -> str:
        """The gradebook's notebook column: the exercise notebook's name, else the file name."""
        return exercise_name(self.key) if self.key else self.path.name


def safe_name(student: str) -> str:
    """A file name for ``student``: ASCII letters, digits, ``._-`` and a short hash.

    The hash keeps names apart that differ only in characters the ASCII form drops
    ("José" and "Jose", "a b" and "a_b").
    """
    ascii_name = unicodedata.normalize("NFKD", student).encode("ascii", "ignore").decode()
    slug = _UNSAFE.sub("_", ascii_name).strip("._-")[:40] or "student"
    digest = hashlib.sha1(student.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{slug}-{digest}"


def find_submissions(root: Path) -> tuple[list[Submission], list[Path]]:
    """Submissions under ``root`` and the notebooks that sit outside any student folder.

    ``.ipynb_checkpoints`` and hidden folders are skipped. The order is stable (sorted).
    """
    found: list[Submission] = []
    stray: list[Path] = []
    for path in sorted(root.rglob("*.ipynb")):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts):
            continue
        if len(parts) < 2 or len(parts) > 3:
            stray.append(path)
            continue
        found.append(Submission(parts[0], path, notebook_key(path.name)))
    return found, stray


def pick_latest(submissions: list[Submission]) -> tuple[list[Submission], list[tuple[Submission,
                                                                                        Submission]]]:
    """One submission per (student, notebook): the newest file, and (dropped, kept) pairs."""
    groups: dict[tuple[str, str], list[Submission]] = {}
    for sub in submissions:
        groups.setdefault((sub.student, sub.notebook), []).append(sub)
    kept, dropped = [], []
    for group in groups.values():
        group.sort(key=lambda s: (s.path.stat().st_mtime, str(s.path)))
        kept.append(group[-1])
        dropped.extend((other, group[-1]) for other in group[:-1])
    kept.sort(key=lambda s: (s.student, s.notebook))
    return kept, dropped


def read_submission(path: Path) -> tuple[Any | None, str]:
    """The notebook, or None and why it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        return None, f"cannot read the file: {error}"
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return None, "not a text file (not UTF-8), so not a notebook"
    except json.JSONDecodeError as error:
        return None, f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if not isinstance(data, dict) or not isinstance(data.get("cells", None), list) \
            and data.get("nbformat") != 3:
        return None, "valid JSON but not a Jupyter notebook (no list of cells)"
    try:
        nb = nbformat.reads(json.dumps(data), as_version=4)
        for cell in nb.cells:
            if cell.get("cell_type") not in ("code", "markdown", "raw") \
                    or not isinstance(cell.get("source", ""), str):
                raise ValueError(f"a cell of type {cell.get('cell_type')!r}")
    except Exception as error:  # nbformat raises many types for malformed notebooks
        return None, f"not a readable Jupyter notebook ({type(error).__name__}: {error})"
    return nb, ""


@dataclass
class Solution:
    """A solution notebook and its checks."""

    key: str
    path: Path
    notebook: Any

    @property
    def checks(self) -> list[tuple[str, float]]:
        """(grade_id, points) of every check, in order."""
        return [(grade_id(c) or "", points(c)) for c in check_cells(self.notebook)]


def load_solutions(directory: Path) -> dict[str, Solution]:
    """Every ``NN_name_solutions.ipynb`` in ``directory``, by ``NN_name``."""
    found = {}
    for path in sorted(directory.glob(f"*{SOLUTION_SUFFIX}.ipynb")):
        key = path.stem[: -len(SOLUTION_SUFFIX)]
        found[key] = Solution(key, path, read_notebook(path))
    return found
