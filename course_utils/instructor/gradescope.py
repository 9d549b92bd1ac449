"""Gradescope: an autograder zip built from the course, and ``results.json`` from our grader.

Gradescope's contract (gradescope-autograders.readthedocs.io, "Autograder Specifications"):
the zip holds ``setup.sh`` (run once, as root, when Gradescope builds the image) and
``run_autograder`` (run once per submission, in ``/autograder``); the learner's files arrive in
``/autograder/submission/``; the script writes ``/autograder/results/results.json``.

The zip built here holds the course's package and lock at the version it was built from, the
solution notebooks of the lessons it grades, and two scripts: ``setup.sh`` installs Python and
the course into ``/autograder/venv``; ``run_autograder`` calls ``python -m course_utils grade
/autograder/submission --format gradescope``, which grades every notebook it finds there, one
Gradescope test per check. ``GRADESCOPE_ROOT`` (default ``/autograder``) and ``COURSE_PYTHON``
move both scripts elsewhere, which is how the tests run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import course_utils
from course_utils.instructor.cells import SOLUTION_SUFFIX, check_cells, grade_id, notebook_key
from course_utils.instructor.gradebook import PASSED, UNGRADABLE, Row
from course_utils.instructor.limits import Limits
from course_utils.instructor.protection import protect
from course_utils.instructor.submissions import Solution, Submission, load_solutions

__all__ = ["HIDDEN_TAG", "OUTPUT_LIMIT", "VISIBILITIES", "build_autograder",
           "grade_for_gradescope", "results_json", "unpack_autograder"]

#: Gradescope's visibility settings for a test or the whole result.
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
#: A check cell tagged so in the solution is graded, but shown only as ``hidden_visibility``.
HIDDEN_TAG = "gradescope-hidden"
#: The most characters of text one ``output`` field carries (Gradescope shows it to learners).
OUTPUT_LIMIT = 8_000

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
# It installs Python 3.11 or newer and the course exactly as this zip was built: version {version}.
set -euo pipefail
ROOT="${{GRADESCOPE_ROOT:-/autograder}}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip
PYTHON=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    apt-get install -y -qq software-properties-common
    add-apt-repository -y ppa:deadsnakes/ppa
    apt-get update -qq
    apt-get install -y -qq python3.11 python3.11-venv
    PYTHON=python3.11
fi
"$PYTHON" -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --quiet --upgrade pip
"$ROOT/venv/bin/python" -m pip install --quiet -c "$ROOT/source/course/requirements/lock.txt" \\
    "$ROOT/source/course[grading]"
"$ROOT/venv/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
# The grader runs each notebook as an unprivileged sandbox user (a user id with no account, so
# nothing to create here): the course and Python must be readable but not writable by it.
chmod -R go-w "$ROOT/venv" "$ROOT/source"
chmod -R go+rX "$ROOT/venv" "$ROOT/source/course"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this once per submission, in /autograder: grade every notebook the learner
# submitted and write results/results.json (it is written whatever the submission does).
set -uo pipefail
ROOT="${{GRADESCOPE_ROOT:-/autograder}}"
PYTHON="${{COURSE_PYTHON:-$ROOT/venv/bin/python}}"
mkdir -p "$ROOT/results"
cd "$ROOT"
exec "$PYTHON" -m course_utils grade "$ROOT/submission" --format gradescope \\
    --solutions "$ROOT/source/solutions" --out "$ROOT/results/results.json" \\
    --timeout {timeout:g} --jobs {jobs} --visibility {visibility} \\
    --hidden-visibility {hidden_visibility} --memory-gb {memory_gb:g} \\
    --max-processes {processes}
"""

#: What the zip carries of the repository, besides the chosen solutions.
COURSE_FILES = ("pyproject.toml", "README.md", "requirements/lock.txt")


def _repo_root() -> Path:
    return Path(course_utils.__file__).resolve().parent.parent


def _course_revision(root: Path) -> str:
    """The course's version, with the git commit it was built from when there is one."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return course_utils.__version__
    return f"{course_utils.__version__} (commit {commit})"


def build_autograder(out: Path, solutions_dir: Path, lessons: Sequence[str] = (), *,
                     timeout: float = 300.0, jobs: int = 2, visibility: str = "visible",
                     hidden_visibility: str = "after_published",
                     limits: Limits | None = None) -> Path:
    """Write Gradescope's autograder zip to ``out``: the course, the solutions of ``lessons``
    (numbers such as ``"03"``; all when empty), ``setup.sh`` and ``run_autograder`` (which
    grades under ``limits``)."""
    limits = limits or Limits()
    for value in (visibility, hidden_visibility):
        if value not in VISIBILITIES:
            raise ValueError(f"visibility {value!r}: use one of {', '.join(VISIBILITIES)}")
    solutions = sorted(solutions_dir.glob(f"*{SOLUTION_SUFFIX}.ipynb"))
    chosen = [p for p in solutions if not lessons or p.name.split("_", 1)[0] in lessons]
    missing = set(lessons) - {p.name.split("_", 1)[0] for p in chosen}
    if missing or not chosen:
        known = ", ".join(sorted(p.name.split("_", 1)[0] for p in solutions)) or "none"
        raise ValueError(f"no solutions notebook for lesson(s) {sorted(missing) or lessons} "
                         f"in {solutions_dir} (known: {known})")
    root = _repo_root()
    out.parent.mkdir(parents=True, exist_ok=True)
    scripts = {
        "setup.sh": SETUP_SH.format(version=_course_revision(root)),
        "run_autograder": RUN_AUTOGRADER.format(timeout=timeout, jobs=jobs,
                                                visibility=visibility,
                                                hidden_visibility=hidden_visibility,
                                                memory_gb=limits.memory_gb,
                                                processes=limits.processes)}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in scripts.items():
            info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
            info.external_attr = (stat.S_IFREG | 0o755) << 16  # executable once unzipped
            archive.writestr(info, text)
        for path in chosen:
            archive.write(path, f"solutions/{path.name}")
        for name in COURSE_FILES:
            archive.write(root / name, f"course/{name}")
        for path in sorted((root / "course_utils").rglob("*.py")):
            archive.write(path, f"course/{path.relative_to(root).as_posix()}")
    return out


def _capped(text: str, limit: int = OUTPUT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 40] + f"\n… ({len(text)} characters, cut)"


def _hidden_checks(solution: Solution) -> set[str]:
    return {grade_id(cell) or "" for cell in check_cells(solution.notebook)
            if HIDDEN_TAG in cell.get("metadata", {}).get("tags", [])}


def results_json(rows_by_notebook: dict[str, list[Row]], solutions: dict[str, Solution], *,
                 seconds: float, notes: Sequence[str] = (), visibility: str = "visible",
                 hidden_visibility: str = "after_published") -> dict[str, Any]:
    """Gradescope's ``results.json`` for one learner: a test per check, in course order."""
    tests, lines = [], []
    for key in sorted(solutions):
        notebook = f"{key}_exercises.ipynb"
        rows = rows_by_notebook.get(key) or [
            Row("", notebook, gid, 0.0, pts, "not submitted",
                f"not submitted: upload {notebook} (the file name must stay as handed out)")
            for gid, pts in solutions[key].checks]
        hidden = _hidden_checks(solutions[key])
        for row in rows:
            tests.append({
                "name": f"{key} · {row.exercise}" if row.exercise else f"{key} · {notebook}",
                "score": row.points, "max_score": row.max_points,
                "status": "passed" if row.status == PASSED else "failed",
                "output": _capped(row.feedback if row.feedback.startswith(row.status)
                                  else f"{row.status}: {row.feedback}".rstrip(": ")),
                "visibility": hidden_visibility if row.exercise in hidden else visibility})
        got, top = sum(r.points for r in rows), sum(r.max_points for r in rows)
        lines.append(f"{notebook}: {got:g} of {top:g} points")
    summary = "\n".join([*lines, *notes])
    return {"score": sum(test["score"] for test in tests),
            "execution_time": round(seconds, 1), "output": _capped(summary),
            "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}


def _submitted(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The newest submitted notebook of each exercise under ``folder``, and notes on the rest."""
    found: dict[str, Path] = {}
    notes = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or path.name.startswith("."):
            continue
        key = notebook_key(path.name)
        if key is None:
            notes.append(f"{path.name}: not an exercise notebook of this course, not graded")
        elif key in found and found[key].stat().st_mtime >= path.stat().st_mtime:
            notes.append(f"{path.relative_to(folder)}: another copy of {key} was graded")
        else:
            found[key] = path
    return found, notes


def grade_for_gradescope(submission: Path, solutions_dir: Path, out: Path, *,
                         timeout: float = 300.0, jobs: int = 1, visibility: str = "visible",
                         hidden_visibility: str = "after_published",
                         limits: Limits | None = None) -> dict[str, Any]:
    """Grade one learner's Gradescope submission folder and write ``results.json`` to ``out``.
    Always writes a valid file: a grader failure becomes a zero with the reason. As root (on
    Gradescope), the notebooks run as sandbox users; the file is written after every one of
    their processes is gone, and read back to make sure it holds what the grader wrote."""
    from course_utils.instructor.batch import grade_submission
    from course_utils.instructor.sandbox import kernel_zygote

    start = time.monotonic()
    solutions = load_solutions(solutions_dir)
    try:
        protection = protect([submission, solutions_dir, out], limits)
        found, notes = _submitted(submission)
        unknown = sorted(set(found) - set(solutions))
        notes += [f"{found[k].name}: this autograder does not grade lesson {k}" for k in unknown]
        todo = [Submission("submission", found[k], k) for k in sorted(found) if k in solutions]
        with kernel_zygote(len(todo), protection), \
                ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            graded = list(pool.map(
                lambda s: (s.key, grade_submission(s, solutions, timeout, protection)), todo))
        rows = dict(graded)
        if not found:
            notes.append("no notebook was submitted: upload the exercise notebooks (.ipynb)")
        if any(r.status in UNGRADABLE for group in rows.values() for r in group):
            notes.append("a notebook could not be graded: see its tests for the reason")
        if protection.note:
            print(f"warning: {protection.note}", file=sys.stderr)
        result = results_json(rows, solutions, seconds=time.monotonic() - start, notes=notes,
                              visibility=visibility, hidden_visibility=hidden_visibility)
    except Exception as error:  # the grader's own failure: say so, never leave no results
        result = {"score": 0.0, "execution_time": round(time.monotonic() - start, 1),
                  "output": _capped(f"The autograder failed ({type(error).__name__}: {error}). "
                                    "Your instructor can see the details; resubmit later."),
                  "visibility": visibility, "stdout_visibility": "hidden", "tests": []}
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(result, indent=1, ensure_ascii=False).encode("utf-8")
    for _ in range(3):  # written by the grader only: read back, written again if changed
        _write_private(out, data)
        if out.read_bytes() == data:
            break
        print(f"WARNING: {out} was changed by someone other than the grader right after it "
              "was written; writing it again", file=sys.stderr)
    return result


def _write_private(out: Path, data: bytes) -> None:
    """Write ``data`` to ``out`` atomically, readable by the grader's user only."""
    tmp = out.with_name(out.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(handle, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, out)


def unpack_autograder(zip_path: Path, root: Path) -> Path:
    """Lay an autograder zip out as Gradescope does (``root/source``, ``root/submission``,
    ``root/results``) and return ``root/source/run_autograder``."""
    source = root / "source"
    shutil.rmtree(source, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(source)
    for name in ("run_autograder", "setup.sh"):
        (source / name).chmod(0o755)
    (root / "submission").mkdir(parents=True, exist_ok=True)
    (root / "results").mkdir(parents=True, exist_ok=True)
    return source / "run_autograder"
