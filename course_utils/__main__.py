"""Command line of the course: ``python -m course_utils COMMAND``.

Commands:
  doctor      print a report of this machine and what each lesson can use here
  exercises   generate exercises/ from solutions/ (``--check`` fails when out of sync)
  grade       grade a folder of submitted exercise notebooks into a CSV gradebook
  new         write a new notebook skeleton that follows the conventions: new PATH "Title"
"""

from __future__ import annotations

import sys

_GRADING_COMMANDS = ("exercises", "grade", "check")


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
        if len(rest) != 2:
            print('usage: python -m course_utils new notebooks/NN_name.ipynb "Title"',
                  file=sys.stderr)
            return 2
        from course_utils.notebooks import new_notebook

        print(f"wrote {new_notebook(rest[0], rest[1])}")
        return 0
    if command in _GRADING_COMMANDS:
        from course_utils.grading.cli import main as grading_main

        return grading_main(argv)
    print(f"unknown command {command!r}.\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
