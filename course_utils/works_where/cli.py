"""``python -m course_utils works-where [--write | --check]``: run the table in a fresh process.

Without options it prints the table. ``--write`` writes ``docs/what_works_where.md`` and the
README's copy (between its markers). ``--check`` fails (exit 1) when a fresh run and the
committed table disagree on any cell's status.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["TABLE_PATH", "README_PATH", "committed_table_path", "table_document",
           "readme_section", "main"]

#: The committed table and the README that shows it, relative to the repository root.
TABLE_PATH = Path("docs/what_works_where.md")
README_PATH = Path("README.md")

_TITLE = "# What works where\n\n"
_INTRO = ("Every data-parallel training API of the course under every strategy (lesson 06's "
          "model parallelism is no row), each cell a small real training job (a ➖ cell runs "
          "none; notebooks/A_what_works_where.ipynb explains each row and column).\n\n")


def committed_table_path(start: str | Path = ".") -> Path | None:
    """The committed table in ``start`` or a folder above it (a clone), else None (Colab)."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / TABLE_PATH).is_file():
            return folder / TABLE_PATH
    return None


def table_document(markdown: str) -> str:
    """The committed file: a title, one line on what it is, then the table."""
    return _TITLE + _INTRO + markdown.strip() + "\n"


def readme_section(document: str) -> str:
    """What the README shows between its markers: the document without its title."""
    if not document.startswith(_TITLE):
        raise ValueError(f"{TABLE_PATH} must start with {_TITLE.strip()!r}")
    return document[len(_TITLE):].strip()


def main(argv: list[str] | None = None) -> int:
    """Run the table; print it, write it (``--write``) or compare it (``--check``)."""
    parser = argparse.ArgumentParser(prog="python -m course_utils works-where",
                                     description=__doc__)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="write the table and the README")
    action.add_argument("--check", action="store_true",
                        help="exit 1 when a cell's status differs from the committed table")
    parser.add_argument("--root", default=".", help="the repository root")
    args = parser.parse_args(argv)
    root = Path(args.root)

    from course_utils.environment import setup

    setup(logical_devices=2, seed=0)
    from course_utils.works_where.matrix import run_matrix
    from course_utils.works_where.table import (
        replace_between_markers,
        status_differences,
        statuses_from_markdown,
        to_markdown,
    )

    document = table_document(to_markdown(run_matrix()))
    if args.check:
        committed = (root / TABLE_PATH).read_text(encoding="utf-8")
        differences = status_differences(statuses_from_markdown(committed),
                                         statuses_from_markdown(document))
        for line in differences:
            print(f"differs from {TABLE_PATH}: {line}")
        if not differences:
            print(f"every cell's status agrees with {TABLE_PATH}")
        return 1 if differences else 0
    if args.write:
        (root / TABLE_PATH).parent.mkdir(parents=True, exist_ok=True)
        (root / TABLE_PATH).write_text(document, encoding="utf-8")
        replace_between_markers(root / README_PATH, readme_section(document))
        print(f"wrote {TABLE_PATH} and its copy in {README_PATH}")
        return 0
    print(document)
    return 0

