"""Command line of the course: ``python -m course_utils COMMAND``.

Commands:
  doctor      print a report of this machine and what each lesson can use here
  exercises   generate exercises/ from solutions/ (``--check`` fails when out of sync)
  grade       grade a folder of submitted exercise notebooks into a CSV gradebook
              (--format gradescope: one learner's submission into Gradescope's results.json)
  check       run one exercise notebook as the grader does and print its points
  gradescope  build: Gradescope's autograder zip (--lessons 03 04 ... --out autograder.zip)
  canvas      a Canvas gradebook import of a CSV gradebook
  new         scaffold a lesson: new NN name ["Title"] writes notebooks/NN_name.ipynb, its
              solutions and exercises notebooks, course_utils/grading/checks/lesson_NN.py and
              tests/test_checks_lesson_NN.py (never overwrites; the title defaults to the name,
              "multi_worker" -> "Multi worker"); new PATH.ipynb "Title" writes one notebook
              skeleton
  works-where run every data-parallel training API under every strategy, print the table
              (``--write`` updates docs/what_works_where.md and the README, ``--check`` fails
              when a cell's status differs from the committed table)
"""

from __future__ import annotations

import sys

_GRADING_COMMANDS = ("exercises", "grade", "check", "gradescope", "canvas")


def _title_from_name(name: str) -> str:
    """The default lesson title for a scaffold name: ``"multi_worker"`` -> ``"Multi worker"``."""
    return name.replace("_", " ").strip().capitalize()


def _new(rest: list[str]) -> int:
    """``new NN name ["Title"]`` (a whole lesson) or ``new PATH.ipynb "Title"`` (one notebook)."""
    if len(rest) == 2 and rest[0].endswith(".ipynb"):
        from course_utils.notebooks import new_notebook

        print(f"wrote {new_notebook(rest[0], rest[1])}")
        return 0
    if len(rest) == 2 and not rest[0].endswith(".ipynb"):
        rest = [*rest, _title_from_name(rest[1])]
    if len(rest) != 3:
        print('usage: python -m course_utils new NN name ["Title"]   (e.g. new 03 multi_worker '
              '"Multi-worker training")\n'
              '       python -m course_utils new notebooks/NN_name.ipynb "Title"',
              file=sys.stderr)
        return 2
    from pathlib import Path

    from course_utils.instructor.scaffold import scaffold_lesson

    try:
        files = scaffold_lesson(Path.cwd(), *rest)
    except (FileExistsError, ValueError) as error:
        print(f"new: {error}", file=sys.stderr)
        return 1
    for path in files.values():
        print(f"wrote {path.relative_to(Path.cwd())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``python -m course_utils COMMAND [ARGS]`` and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "doctor":
        from course_utils.devices import doctor_main

        return doctor_main(rest)
    if command == "new":
        return _new(rest)
    if command == "works-where":
        from course_utils.works_where.cli import main as works_where_main

        return works_where_main(rest)
    if command in _GRADING_COMMANDS:
        from course_utils.instructor.cli import main as grading_main

        return grading_main(argv)
    print(f"unknown command {command!r}.\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
