"""The book's table of contents, in course order, derived from the notebooks themselves.

``make book`` builds the course as a site with Sphinx, MyST-NB and sphinx-book-theme
(``docs/book/conf.py``). Sphinx needs its table of contents written out; this module derives it
from the files, because that is what the tool cannot do: a new lesson then appears in the book
by adding its notebooks, with no table to edit. Lessons come by number, each followed by its
exercises; then the appendices (``A_name.ipynb``), the reference pages, and last the solutions,
in a part of their own that an instructor leaves out of a public build (``BOOK_SOLUTIONS=0``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
from typing import Any

__all__ = ["FOLDERS", "REFERENCE_PAGES", "course_order", "notebook_title", "table_of_contents"]

#: The folders of the course's notebooks, in the order a lesson's entries are listed.
FOLDERS = ("notebooks", "exercises", "solutions")
#: Pages of the book that are not notebooks, after the appendices (paths without suffix).
REFERENCE_PAGES = ("docs/what_works_where", "docs/course_design", "CONTRIBUTING")

_NUMBER = re.compile(r"^(\d+)_")
_APPENDIX = re.compile(r"^([A-Z])_")
#: Appendices sort after every lesson, by letter.
_APPENDIX_RANK = 1_000_000


def notebook_title(path: str | os.PathLike) -> str:
    """The notebook's title: the first line of its first cell without ``#`` (else its name)."""
    path = pathlib.Path(path)
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        cells = []
    if cells and cells[0].get("cell_type") == "markdown":
        source = cells[0].get("source", "")
        lines = ("".join(source) if isinstance(source, list) else source).strip().splitlines()
        if lines and lines[0].startswith("#"):
            return lines[0].lstrip("#").strip()
    return path.stem


def _rank(name: str) -> int:
    match, appendix = _NUMBER.match(name), _APPENDIX.match(name)
    if match:
        return int(match.group(1))
    return _APPENDIX_RANK + ord(appendix.group(1)) if appendix else sys.maxsize


def course_order(root: str | os.PathLike = ".") -> list[pathlib.Path]:
    """Every course notebook under ``root``, relative to it: by lesson number, then
    lesson, exercises, solutions (the order of :data:`FOLDERS`); appendices last, by letter."""
    root = pathlib.Path(root)
    found = [(_rank(path.name), rank, path.name, path.relative_to(root))
             for rank, folder in enumerate(FOLDERS) for path in (root / folder).glob("*.ipynb")]
    return [path for *_, path in sorted(found)]


def table_of_contents(root: str | os.PathLike = ".", solutions: bool = True) -> dict[str, Any]:
    """The book's table of contents for sphinx-external-toc: the README as the landing page;
    "Lessons" (each lesson with its exercises beneath it), "Appendix", "Reference" and, with
    ``solutions``, "Solutions"."""
    root = pathlib.Path(root)
    lessons: list[dict[str, Any]] = []
    appendix: list[dict[str, Any]] = []
    answers: list[dict[str, str]] = []
    for relative in course_order(root):
        doc = relative.with_suffix("").as_posix()
        if relative.parts[0] == "solutions":
            answers.append({"file": doc})
        elif relative.parts[0] == "exercises" and lessons:
            lessons[-1].setdefault("sections", []).append({"file": doc})
        elif _APPENDIX.match(relative.name):
            appendix.append({"file": doc})
        else:
            lessons.append({"file": doc})
    reference = [{"file": page} for page in REFERENCE_PAGES
                 if (root / f"{page}.md").is_file()]
    parts = [{"caption": "Lessons", "numbered": False, "chapters": lessons},
             {"caption": "Appendix", "chapters": appendix},
             {"caption": "Reference", "chapters": reference}]
    if solutions:
        parts.append({"caption": "Solutions", "chapters": answers})
    return {"format": "jb-book", "root": "README",
            "parts": [part for part in parts if part["chapters"]]}
