"""The batch grader: a folder of submissions in, a CSV gradebook and feedback out.

For each submission (see ``discover``): read it, match it to its solution notebook, put the
instructor's check and locked cells back (``assemble``), execute it in a fresh kernel in a
temporary folder under a time limit in a worker process (``worker``), score each check and
append its rows to the gradebook at once. Nothing a submission does aborts the batch: it
becomes a row with a status and a reason.

Security: the submission's code runs with the rights of the user running the grader. Run
untrusted classes inside a container (see the README's instructors' section).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil

import course_utils
from course_utils.grading.assemble import CHECK_MARKER, Prepared, prepare
from course_utils.grading.discover import Submission, find_submissions, pick_latest
from course_utils.grading.framework import STRICT_ENV
from course_utils.grading.gradebook import (
    DUPLICATE,
    ERROR,
    FAILED,
    GRADER_ERROR,
    INVALID,
    KERNEL_DIED,
    NOT_ATTEMPTED,
    PASSED,
    STRAY,
    TAMPERED,
    TIMEOUT,
    UNGRADABLE,
    UNKNOWN,
    Gradebook,
    Row,
    read_rows,
)
from course_utils.grading.notebooks import (
    SOLUTION_SUFFIX,
    check_cells,
    grade_id,
    points,
    read_notebook,
)

__all__ = ["DEFAULT_TIMEOUT", "BatchResult", "Solution", "grade_folder", "grade_submission",
           "load_solutions", "score"]

#: Default time limit for one submission, in seconds (kernel start included).
DEFAULT_TIMEOUT = 180.0
#: Extra seconds the worker process gets beyond the time limit before it is killed.
WORKER_GRACE = 60.0
FEEDBACK_LIMIT = 600
PACKAGE_DIR = Path(course_utils.__file__).resolve().parent
_ACTIVE: set[subprocess.Popen[bytes]] = set()  # running workers, killed on Ctrl-C
_ACTIVE_LOCK = threading.Lock()
_STOP = threading.Event()  # set on Ctrl-C: start no new worker


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


def one_line(text: str, limit: int = FEEDBACK_LIMIT) -> str:
    """Feedback for a CSV cell: one line, no ANSI colours, at most ``limit`` characters."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    text = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kernel_env(workdir: Path) -> dict[str, str]:
    """The environment of a grading kernel: strict checks, quiet TensorFlow, no user config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "COURSE_"))}
    root = str(PACKAGE_DIR.parent)
    env.update({
        STRICT_ENV: "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p),
        "IPYTHONDIR": str(workdir / ".ipython"),
        "MPLCONFIGDIR": str(workdir / ".matplotlib"),
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(process.pid)
        procs = [*parent.children(recursive=True), parent]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=5)


def run_prepared(prepared: Prepared, timeout: float) -> dict[str, Any]:
    """Execute a prepared notebook in a worker process; return the worker's result."""
    tmp = Path(tempfile.mkdtemp(prefix="cu-grade-"))
    try:
        work = tmp / "work"
        work.mkdir()
        job, result = tmp / "job.json", tmp / "result.json"
        job.write_text(json.dumps({"notebook": prepared.notebook, "cwd": str(work),
                                   "env": kernel_env(tmp), "timeout": timeout}),
                       encoding="utf-8")
        env = dict(os.environ)
        env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")  # connection files: private, writable
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p)
        with (tmp / "worker.log").open("wb") as log, _ACTIVE_LOCK:
            if _STOP.is_set():
                return {"status": "interrupted", "cells": []}
            process = subprocess.Popen(
                [sys.executable, "-m", "course_utils.grading.worker", str(job), str(result)],
                cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
            _ACTIVE.add(process)
        try:
            process.wait(timeout=timeout + WORKER_GRACE)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "cells": []}
        finally:
            _kill_tree(process)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(process)
        if not result.exists():
            log_text = (tmp / "worker.log").read_text(encoding="utf-8", errors="replace")
            return {"status": f"worker failed (exit {process.returncode}): {log_text[-400:]}",
                    "cells": []}
        return json.loads(result.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cell_label(nb: Any, index: int) -> str:
    source = nb.cells[index].get("source", "")
    source = source.split(CHECK_MARKER, 1)[-1]  # a check cell: name the check, not the guard
    first = next((line.strip() for line in source.splitlines()
                  if line.strip() and not line.startswith("#")), "")
    return f"the cell {first[:60]!r}" if first else f"code cell {index + 1}"


def score(prepared: Prepared, result: dict[str, Any], timeout: float,
          student: str, notebook: str) -> list[Row]:
    """Gradebook rows for one executed submission."""
    outcomes = {cell["index"]: cell for cell in result.get("cells", [])}
    run_status = str(result.get("status", ""))
    nb = prepared.notebook
    stop = next((o for o in result.get("cells", []) if o["status"] in ("timeout", "dead")), None)
    first_error = next((o for o in result.get("cells", []) if o["status"] == "error"
                        and o["index"] not in {c.cell_index for c in prepared.checks}), None)
    notes = {note.split("'")[1]: note for note in prepared.notes if "'" in note}
    rows = []
    for check in prepared.checks:
        outcome = outcomes.get(check.cell_index, {"status": "not run"})
        state, ename = outcome["status"], outcome.get("ename", "")
        message = outcome.get("evalue", "")
        feedback, got = "", 0.0
        if state == "ok":
            status, got = PASSED, check.points
        elif state == "error" and ename == "NotAttemptedError":
            status, feedback = NOT_ATTEMPTED, "not attempted: the function still raises " \
                                              "NotImplementedError"
        elif state == "error" and ename == "AssertionError":
            status, feedback = FAILED, message
        elif state == "error" and message.startswith("grader:"):
            status, feedback = TAMPERED, message
        elif state == "error":
            status, feedback = ERROR, f"{ename}: {message}"
            if first_error is not None:
                feedback += (f" (first error in your cells: {_cell_label(nb, first_error['index'])}"
                             f" raised {first_error['ename']}: {first_error['evalue']})")
        elif state == "timeout":
            status = TIMEOUT
            feedback = f"the time limit of {timeout:g} s was reached while this check ran " \
                       "(an endless loop?)"
        elif run_status == "timeout":
            status = TIMEOUT
            where = f" in {_cell_label(nb, stop['index'])}" if stop else ""
            feedback = f"not run: the time limit of {timeout:g} s was reached earlier{where}"
        elif run_status == "dead" or state == "dead":
            status = KERNEL_DIED
            where = f" in {_cell_label(nb, stop['index'])}" if stop else ""
            feedback = (f"not run: the Python kernel died{where} (os._exit, a crash or out of "
                        "memory)")
        else:
            status, feedback = GRADER_ERROR, f"not run: {run_status or 'unknown reason'}"
        note = notes.get(check.grade_id)
        if not rows:  # notes on restored cells that are not checks (the set-up cell)
            others = [n for k, n in notes.items() if k not in {c.grade_id for c in prepared.checks}]
            note = ". ".join([*others, note] if note else others)
        if note:
            feedback = f"{note}. {feedback}".strip()
        rows.append(Row(student, notebook, check.grade_id, got, check.points, status,
                        one_line(feedback)))
    return rows


def _read_submission(path: Path) -> tuple[Any | None, str]:
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


def grade_submission(sub: Submission, solutions: dict[str, Solution],
                     timeout: float = DEFAULT_TIMEOUT) -> list[Row]:
    """Grade one submission into gradebook rows (never raises for a bad submission)."""
    solution = solutions.get(sub.key or "")
    if solution is None:
        known = ", ".join(f"{k}_exercises.ipynb" for k in sorted(solutions)) or "none"
        return [Row(sub.student, sub.notebook, "", 0, 0, UNKNOWN,
                    one_line(f"no solution notebook matches {sub.path.name!r} (known: {known})"))]
    checks = solution.checks
    try:
        nb, problem = _read_submission(sub.path)
        if nb is None:
            return [Row(sub.student, sub.notebook, gid, 0, pts, INVALID, one_line(problem))
                    for gid, pts in checks]
        prepared = prepare(nb, solution.notebook, PACKAGE_DIR)
        result = run_prepared(prepared, timeout)
        return score(prepared, result, timeout, sub.student, sub.notebook)
    except Exception as error:  # a bug in the grader must not abort the batch
        return [Row(sub.student, sub.notebook, gid, 0, pts, GRADER_ERROR,
                    one_line(f"{type(error).__name__}: {error}")) for gid, pts in checks]


@dataclass
class BatchResult:
    """What a batch run did."""

    rows: list[Row]  # rows written by this run
    skipped: int  # submissions already in the gradebook
    seconds: float

    @property
    def ungradable(self) -> list[Row]:
        """Rows of submissions that could not be graded at all."""
        return [row for row in self.rows if row.status in UNGRADABLE]


def grade_folder(submissions: Path, solutions_dir: Path, out: Path, *,
                 feedback_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
                 jobs: int = 1, force: bool = False, progress: bool = True,
                 on_rows: Callable[[list[Row]], None] | None = None) -> BatchResult:
    """Grade every submission under ``submissions`` into the CSV gradebook ``out``."""
    from tqdm import tqdm

    start = time.monotonic()
    solutions = load_solutions(solutions_dir)
    if not solutions:
        raise FileNotFoundError(f"no *{SOLUTION_SUFFIX}.ipynb in {solutions_dir}")
    found, stray = find_submissions(submissions)
    kept, dropped = pick_latest(found)
    todo_keys = {(s.student, s.notebook) for s in kept}
    existing = [] if force else read_rows(out)
    retry = {row.key for row in existing if row.status == GRADER_ERROR}  # our fault: try again
    done = {row.key for row in existing} - retry
    book = Gradebook(out, drop_keys=(todo_keys if force else retry & todo_keys) or None)

    written: list[Row] = []

    def emit(rows: list[Row]) -> None:
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
    _STOP.clear()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(grade_submission, sub, solutions, timeout): sub
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
            with _ACTIVE_LOCK:
                _STOP.set()
                running = list(_ACTIVE)
            for process in running:
                _kill_tree(process)
            raise
    finally:
        pool.shutdown(wait=True)
        bar.close()
    if feedback_dir is not None:
        from course_utils.grading.feedback import write_feedback

        write_feedback([r for r in read_rows(out) if r.student], feedback_dir)
    return BatchResult(written, skipped, time.monotonic() - start)
