"""Find submissions: ``SUBMISSIONS/<student>/<notebook>.ipynb`` or nbgrader's
``submitted/<student>/<assignment>/<notebook>.ipynb``; safe file names for student names."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from course_utils.grading.notebooks import exercise_name, notebook_key

__all__ = ["Submission", "find_submissions", "pick_latest", "safe_name"]

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
