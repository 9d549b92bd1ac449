"""``python -m course_utils exercises|grade|check|gradescope|canvas ...``: the instructor's
commands.

  exercises [--check]           generate exercises/ from solutions/ (--check: fail when out of sync)
  grade SUBMISSIONS --out CSV   grade a folder of submitted notebooks into a CSV gradebook
                                (--format gradescope: one learner's folder into results.json)
  check NOTEBOOK                run one notebook as the grader does and print its score
  gradescope build --out ZIP    Gradescope's autograder zip (--lessons 03 04 ...: only those)
  canvas GRADEBOOK --out CSV    a Canvas gradebook import of a CSV gradebook
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["COMMANDS", "EXERCISES", "SOLUTIONS", "main"]

SOLUTIONS = Path("solutions")
EXERCISES = Path("exercises")


def _exercises(argv: list[str]) -> int:
    from course_utils.instructor.generate import SolutionFormatError, generate, out_of_sync

    parser = argparse.ArgumentParser(
        prog="python -m course_utils exercises",
        description="Generate exercises/NN_name_exercises.ipynb from solutions/NN_name_solutions"
                    ".ipynb: solution blocks become stubs raising NotImplementedError.")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="default: solutions/")
    parser.add_argument("--exercises", type=Path, default=EXERCISES, help="default: exercises/")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the committed exercises differ")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = out_of_sync(args.solutions, args.exercises)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("exercises are out of sync with solutions: run `make exercises` "
                      "(python -m course_utils exercises) and commit the result.",
                      file=sys.stderr)
                return 1
            print(f"exercises in sync with {args.solutions}/")
            return 0
        changed = generate(args.solutions, args.exercises)
    except SolutionFormatError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"wrote {path}")
    print(f"{len(changed)} exercise notebook(s) changed")
    return 0


def _grade(argv: list[str]) -> int:
    from course_utils.instructor.batch import DEFAULT_JOBS, DEFAULT_TIMEOUT, grade_folder
    from course_utils.instructor.feedback import summary_table
    from course_utils.instructor.gradescope import VISIBILITIES, grade_for_gradescope
    from course_utils.instructor.limits import Limits
    from course_utils.instructor.protection import SandboxError

    parser = argparse.ArgumentParser(
        prog="python -m course_utils grade",
        description="Grade SUBMISSIONS/<student>/<notebook>.ipynb (or nbgrader's submitted/"
                    "<student>/<assignment>/<notebook>.ipynb) into a CSV gradebook. Each "
                    "notebook runs in a fresh kernel with the instructor's checks put back. "
                    "As root, each notebook runs as its own unprivileged sandbox user under "
                    "limits; otherwise submitted code runs with your rights.")
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="default: solutions/")
    parser.add_argument("--out", type=Path, default=None,
                        help="CSV gradebook, appended to and resumed (default: gradebook.csv); "
                             "with --format gradescope, results.json")
    parser.add_argument("--format", choices=("csv", "gradescope"), default="csv",
                        help="gradescope: SUBMISSIONS is one learner's folder (Gradescope's "
                             "/autograder/submission), written as Gradescope's results.json")
    parser.add_argument("--visibility", choices=VISIBILITIES, default="visible",
                        help="--format gradescope: when learners see their results")
    parser.add_argument("--hidden-visibility", choices=VISIBILITIES, default="after_published",
                        help="--format gradescope: the same for checks tagged gradescope-hidden")
    parser.add_argument("--feedback", type=Path, default=None,
                        help="folder for one Markdown feedback file per student")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds per notebook, kernel start included "
                             f"(default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"notebooks graded at once, each in its own kernel (default: one "
                             f"per core, {DEFAULT_JOBS} here)")
    parser.add_argument("--force", action="store_true",
                        help="grade again what the gradebook already holds")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    _limit_options(parser)
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    if not args.solutions.is_dir():
        parser.error(f"{args.solutions} is not a folder")
    for folder in (args.submissions, args.solutions):
        if not os.access(folder, os.R_OK | os.X_OK):
            parser.error(f"{folder}: you may not read this folder (a grader run as root leaves "
                         "the folders it grades private to their owner, mode 700)")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: grade at least one notebook at a time")
    limits = Limits(memory_gb=args.memory_gb, processes=args.max_processes)
    if args.format == "gradescope":
        out = args.out or Path("results.json")
        result = grade_for_gradescope(args.submissions, args.solutions, out,
                                      timeout=args.timeout, jobs=args.jobs,
                                      visibility=args.visibility,
                                      hidden_visibility=args.hidden_visibility, limits=limits)
        print(result["output"])
        print(f"score {result['score']:g}; wrote {out}")
        return 0
    args.out = args.out or Path("gradebook.csv")
    try:
        result = grade_folder(args.submissions, args.solutions, args.out,
                              feedback_dir=args.feedback, timeout=args.timeout, jobs=args.jobs,
                              force=args.force, progress=not args.quiet, limits=limits)
    except KeyboardInterrupt:
        print(f"\ninterrupted: what was graded is in {args.out}; run the same command again "
              "to grade the rest", file=sys.stderr)
        return 130
    except SandboxError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result.protection is not None and result.protection.note:
        print(f"warning: {result.protection.note}", file=sys.stderr)
    for line in result.tampered:
        print(f"WARNING: {line}", file=sys.stderr)
    graded = len({r.key for r in result.rows})
    print(f"graded {graded} submission(s) in {result.seconds:.1f} s; "
          f"{result.skipped} already in {args.out} (use --force to grade them again)")
    if result.rows:
        print(summary_table(result.rows))
    if args.feedback is not None:
        print(f"feedback written to {args.feedback}/")
    bad = result.ungradable
    if bad:
        print(f"\n{len({r.key for r in bad})} submission(s) could not be graded:", file=sys.stderr)
        for key, row in {r.key: r for r in bad}.items():
            print(f"  {key[0] or '?'} / {key[1]}: {row.status}: {row.feedback}", file=sys.stderr)
        return 1
    return 1 if result.tampered else 0


def _limit_options(parser: argparse.ArgumentParser) -> None:
    """--memory-gb and --max-processes: what one notebook may use."""
    from course_utils.instructor.limits import DEFAULT_MEMORY_GB, DEFAULT_PROCESSES

    parser.add_argument("--memory-gb", type=float, default=DEFAULT_MEMORY_GB,
                        help=f"memory of each process of a notebook, in GB (default "
                             f"{DEFAULT_MEMORY_GB:g})")
    parser.add_argument("--max-processes", type=int, default=DEFAULT_PROCESSES,
                        help=f"processes and threads of a notebook, as root (default "
                             f"{DEFAULT_PROCESSES})")


def _check(argv: list[str]) -> int:
    from course_utils.instructor.batch import DEFAULT_TIMEOUT, grade_submission, load_solutions
    from course_utils.instructor.cells import notebook_key
    from course_utils.instructor.feedback import student_markdown
    from course_utils.instructor.gradebook import PASSED, UNGRADABLE
    from course_utils.instructor.submissions import Submission

    parser = argparse.ArgumentParser(
        prog="python -m course_utils check",
        description="Run one exercise notebook in a fresh kernel exactly as the grader does "
                    "and print the points of each exercise.")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="default: solutions/")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"{args.notebook} is not a file")
    start = time.monotonic()
    sub = Submission("you", args.notebook, notebook_key(args.notebook.name))
    rows = grade_submission(sub, load_solutions(args.solutions), args.timeout)
    print(student_markdown(str(args.notebook), rows), end="")
    print(f"({time.monotonic() - start:.1f} s)")
    if any(r.status in UNGRADABLE for r in rows):
        return 2
    return 0 if rows and all(r.status == PASSED for r in rows) else 1


def _gradescope(argv: list[str]) -> int:
    from course_utils.instructor.gradescope import VISIBILITIES, build_autograder
    from course_utils.instructor.limits import Limits

    parser = argparse.ArgumentParser(
        prog="python -m course_utils gradescope",
        description="build: Gradescope's autograder zip (setup.sh installs the course at this "
                    "version; run_autograder grades /autograder/submission with our grader).")
    parser.add_argument("action", choices=("build",))
    parser.add_argument("--lessons", nargs="*", default=[],
                        help="lesson numbers to grade, e.g. 03 04 (default: every lesson)")
    parser.add_argument("--out", type=Path, default=Path("autograder.zip"))
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="default: solutions/")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per notebook on Gradescope (default 300)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks graded at once (2)")
    parser.add_argument("--visibility", choices=VISIBILITIES, default="visible")
    parser.add_argument("--hidden-visibility", choices=VISIBILITIES, default="after_published")
    _limit_options(parser)
    args = parser.parse_args(argv)
    try:
        out = build_autograder(args.out, args.solutions, args.lessons, timeout=args.timeout,
                               jobs=args.jobs, visibility=args.visibility,
                               hidden_visibility=args.hidden_visibility,
                               limits=Limits(args.memory_gb, args.max_processes))
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {out}: upload it as the assignment's autograder (Ubuntu 22.04 or newer)")
    return 0


def _canvas(argv: list[str]) -> int:
    from course_utils.instructor.canvas import write_canvas_csv

    parser = argparse.ArgumentParser(
        prog="python -m course_utils canvas",
        description="A Canvas gradebook import (Grades → Import) of a CSV gradebook: one column "
                    "per notebook. Student folders must be named by Canvas login ID.")
    parser.add_argument("gradebook", type=Path)
    parser.add_argument("--out", type=Path, default=Path("canvas.csv"))
    args = parser.parse_args(argv)
    try:
        print(f"wrote {write_canvas_csv(args.gradebook, args.out)}")
    except FileNotFoundError as error:
        parser.error(str(error))
    return 0


COMMANDS = {"exercises": _exercises, "grade": _grade, "check": _check,
            "gradescope": _gradescope, "canvas": _canvas}


def main(argv: list[str] | None = None) -> int:
    """Run ``argv[0]`` (a command of :data:`COMMANDS`) with the remaining arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
