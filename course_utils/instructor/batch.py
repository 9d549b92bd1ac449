"""The batch grader: a folder of submissions in, a CSV gradebook and feedback out.

For each submission (``submissions``): read it, match it to its solution notebook, put the
instructor's check and locked cells back (``assemble``), run it in a fresh kernel under a time
limit (``sandbox``), score each check (``scoring``) and append its rows to the gradebook at once.
Nothing a submission does aborts the batch: it becomes a row with a status and a reason.
Notebooks are graded ``jobs`` at a time (default: one per core), each in its own kernel.

Security (``protection``): as root, each notebook runs as its own sandbox user under limits,
the submissions, solutions, gradebook and feedback are made private, every process of the
notebook is gone before its rows are written, and a gradebook changed by anyone else while the
batch runs is put back and reported. Not as root, the notebooks run with the grader's rights.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.instructor.assemble import prepare
from course_utils.instructor.cells import SOLUTION_SUFFIX
from course_utils.instructor.gradebook import (
    DUPLICATE,
    GRADER_ERROR,
    INVALID,
    STRAY,
    UNGRADABLE,
    UNKNOWN,
    Gradebook,
    Row,
    read_rows,
)
from course_utils.instructor.limits import Limits, limits_hit
from course_utils.instructor.protection import Protection, protect
from course_utils.instructor.sandbox import (
    PACKAGE_DIR,
    allow_runs,
    kernel_zygote,
    run_prepared,
    stop_all,
)
from course_utils.instructor.scoring import one_line, score
from course_utils.instructor.submissions import (
    Solution,
    Submission,
    find_submissions,
    load_solutions,
    pick_latest,
    read_submission,
)

__all__ = ["DEFAULT_JOBS", "DEFAULT_TIMEOUT", "BatchResult", "grade_folder", "grade_submission"]

#: Default time limit for one submission, in seconds (kernel start included).
DEFAULT_TIMEOUT = 180.0
#: Notebooks graded at once by default: one per core, each in its own kernel.
DEFAULT_JOBS = max(1, os.cpu_count() or 1)


def grade_submission(sub: Submission, solutions: dict[str, Solution],
                     timeout: float = DEFAULT_TIMEOUT,
                     protection: Protection | None = None) -> list[Row]:
    """Grade one submission into gradebook rows (never raises for a bad submission); with
    ``protection``, run it as it says (a sandbox user, limits)."""
    solution = solutions.get(sub.key or "")
    if solution is None:
        known = ", ".join(f"{k}_exercises.ipynb" for k in sorted(solutions)) or "none"
        return [Row(sub.student, sub.notebook, "", 0, 0, UNKNOWN,
                    one_line(f"no solution notebook matches {sub.path.name!r} (known: {known})"))]
    checks = solution.checks
    try:
        nb, problem = read_submission(sub.path)
        if nb is None:
            return [Row(sub.student, sub.notebook, gid, 0, pts, INVALID, one_line(problem))
                    for gid, pts in checks]
        prepared = prepare(nb, solution.notebook, PACKAGE_DIR)
        result = run_prepared(prepared, timeout, protection)
        rows = score(prepared, result, timeout, sub.student, sub.notebook)
        hits = limits_hit(result, protection.limits if protection else Limits())
        for row in rows:  # every row of the notebook says which limit it ran into
            row.feedback = one_line(". ".join(p for p in [*hits, row.feedback] if p))
        return rows
    except Exception as error:  # a bug in the grader must not abort the batch
        return [Row(sub.student, sub.notebook, gid, 0, pts, GRADER_ERROR,
                    one_line(f"{type(error).__name__}: {error}")) for gid, pts in checks]


@dataclass
class BatchResult:
    """What a batch run did."""

    rows: list[Row]  # rows written by this run
    skipped: int  # submissions already in the gradebook
    seconds: float
    protection: Protection | None = None
    tampered: list[str] = field(default_factory=list)  # the gradebook changed behind our back

    @property
    def ungradable(self) -> list[Row]:
        """Rows of submissions that could not be graded at all."""
        return [row for row in self.rows if row.status in UNGRADABLE]


def grade_folder(submissions: Path, solutions_dir: Path, out: Path, *,
                 feedback_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
                 jobs: int = DEFAULT_JOBS, force: bool = False, progress: bool = True,
                 on_rows: Callable[[list[Row]], None] | None = None,
                 limits: Limits | None = None) -> BatchResult:
    """Grade every submission under ``submissions`` into the CSV gradebook ``out``."""
    from tqdm import tqdm

    start = time.monotonic()
    solutions = load_solutions(solutions_dir)
    if not solutions:
        raise FileNotFoundError(f"no *{SOLUTION_SUFFIX}.ipynb in {solutions_dir}")
    if feedback_dir is not None:
        feedback_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    protection = protect([submissions, solutions_dir, out, feedback_dir or out], limits)
    found, stray = find_submissions(submissions)
    kept, dropped = pick_latest(found)
    todo_keys = {(s.student, s.notebook) for s in kept}
    existing = [] if force else read_rows(out)
    retry = {row.key for row in existing if row.status == GRADER_ERROR}  # our fault: try again
    done = {row.key for row in existing} - retry
    book = Gradebook(out, drop_keys=(todo_keys if force else retry & todo_keys) or None)

    written: list[Row] = []
    tampered: list[str] = []

    def check_book() -> None:
        if book.changed():
            book.restore()
            tampered.append(f"{out} was changed by someone other than the grader while it "
                            "graded; the grader's own copy was put back")

    def emit(rows: list[Row]) -> None:
        check_book()
        book.add(rows)
        written.extend(rows)
        if on_rows is not None:
            on_rows(rows)

    pending = [sub for sub in kept if (sub.student, sub.notebook) not in done]
    skipped = len(kept) - len(pending)
    extra = [Row(other.student, other.notebook, "", 0, 0, DUPLICATE,
                 one_line(f"{other.path.relative_to(submissions)} not graded: "
                          f"{latest.path.relative_to(submissions)} is newer"))
             for other, latest in dropped if (other.student, other.notebook) not in done]
    extra += [Row("", path.name, "", 0, 0, STRAY,
                  one_line(f"{path.relative_to(submissions)} is not inside a student folder "
                           "(expected SUBMISSIONS/<student>/<notebook>.ipynb)"))
              for path in stray if ("", path.name) not in done]
    if extra:
        emit(extra)
    bar = tqdm(total=len(pending), unit="notebook", desc="grading", disable=not progress,
               dynamic_ncols=True, file=sys.stderr)
    allow_runs()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    with kernel_zygote(len(pending), protection):
        try:
            futures = {pool.submit(grade_submission, sub, solutions, timeout, protection): sub
                       for sub in pending}
            try:
                for future in as_completed(futures):
                    sub = futures[future]
                    try:
                        rows = future.result()
                    except Exception as error:  # pragma: no cover - grade_submission catches
                        rows = [Row(sub.student, sub.notebook, "", 0, 0, GRADER_ERROR,
                                    one_line(repr(error)))]
                    emit(rows)
                    bar.set_postfix_str(f"{sub.student[:20]}: "
                                        f"{sum(r.points for r in rows):g}/"
                                        f"{sum(r.max_points for r in rows):g}")
                    bar.update(1)
            except BaseException:  # Ctrl-C: drop what is queued, kill what runs, keep the gradebook
                pool.shutdown(wait=False, cancel_futures=True)
                stop_all()
                raise
        finally:
            pool.shutdown(wait=True)
            bar.close()
    check_book()
    if feedback_dir is not None:
        from course_utils.instructor.feedback import write_feedback

        write_feedback([r for r in read_rows(out) if r.student], feedback_dir)
    return BatchResult(written, skipped, time.monotonic() - start, protection, tampered)
