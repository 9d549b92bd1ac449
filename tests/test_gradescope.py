"""Gradescope: the built autograder run as Gradescope runs it, and results.json checked against
the documented format (a JSON Schema kept in tests/fixtures/gradescope).

The autograder zip is unpacked into a temporary root laid out as Gradescope lays out
``/autograder`` (``source/``, ``submission/``, ``results/``) and its ``run_autograder`` runs with
``GRADESCOPE_ROOT`` pointing there and this Python as ``COURSE_PYTHON`` (``setup.sh``, which
installs Python and the course on Gradescope's image, is checked for what it installs, not run).
Lesson 00's autograder gets the hostile submissions whose outcome Gradescope reports its own
way (a crashed kernel, a file that is no notebook, an empty upload), and (as root,
where each notebook runs as a sandbox user) those that attack the results: a detached process
rewriting ``results.json``, a notebook reading the solutions and writing into the course, one
past the memory limit. The whole course's autograder, blank, partial and good, runs in
``test_grading_nbgrader.py``. Gradescope grades each notebook with the batch grader's own
``grade_submission``: the submissions that only exercise it (edited checks, an endless loop, a
fake course package) run once, in ``test_grading_grader.py``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import zipfile
from pathlib import Path

import nbformat
import psutil
import pytest

from course_utils.instructor import gradescope
from course_utils.instructor.canvas import canvas_rows, write_canvas_csv
from course_utils.instructor.cells import grade_id, is_check_cell
from course_utils.instructor.gradebook import FAILED, PASSED, Gradebook, Row
from course_utils.instructor.limits import Limits
from course_utils.instructor.sandbox_user import can_switch_user
from course_utils.instructor.submissions import load_solutions

REPO = Path(__file__).resolve().parents[1]
#: Seconds per notebook in lesson 00's autograder for hostile submissions; 30 s timed lesson
#: 00's own checks out on a busy machine.
HOSTILE_TIMEOUT = 60
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "grading"))
import make_submissions  # noqa: E402
from gradescope_run import autograder_root, by_notebook, run_autograder, valid  # noqa: E402

# --- without a kernel -------------------------------------------------------------------------

def test_results_json_has_a_test_per_check_and_zeros_for_missing_notebooks():
    solutions = load_solutions(REPO / "solutions")
    key = sorted(solutions)[0]
    rows = [Row("s", f"{key}_exercises.ipynb", gid, pts if i == 0 else 0.0, pts,
                PASSED if i == 0 else FAILED, "" if i == 0 else "x" * 20_000)
            for i, (gid, pts) in enumerate(solutions[key].checks)]
    result = valid(gradescope.results_json({key: rows}, solutions, seconds=1.5))
    assert len(result["tests"]) == sum(len(s.checks) for s in solutions.values())
    ours = [t for t in result["tests"] if t["name"].startswith(key)]
    assert ours[0]["status"] == "passed" and ours[0]["score"] == ours[0]["max_score"] > 0
    assert len(ours[1]["output"]) <= gradescope.OUTPUT_LIMIT  # the kernel's output is capped
    others = [t for t in result["tests"] if not t["name"].startswith(key)]
    assert all(t["score"] == 0 and "not submitted" in t["output"] for t in others)
    assert result["score"] == ours[0]["score"]


def test_a_check_tagged_hidden_gets_the_hidden_visibility():
    solutions = load_solutions(REPO / "solutions")
    key = sorted(solutions)[0]
    solution = copy.deepcopy(solutions[key])
    check = next(c for c in solution.notebook.cells if is_check_cell(c))
    check.metadata.setdefault("tags", []).append(gradescope.HIDDEN_TAG)
    result = valid(gradescope.results_json({}, {key: solution}, seconds=0,
                                            hidden_visibility="hidden"))
    visibility = {t["name"]: t["visibility"] for t in result["tests"]}
    assert visibility[f"{key} · {grade_id(check)}"] == "hidden"
    assert list(visibility.values()).count("visible") == len(visibility) - 1


def test_the_autograder_zip_holds_the_scripts_the_course_and_the_chosen_solutions(tmp_path):
    out = gradescope.build_autograder(tmp_path / "a.zip", REPO / "solutions", ["00", "01"])
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        setup = archive.read("setup.sh").decode()
        mode = archive.getinfo("run_autograder").external_attr >> 16
    assert {"setup.sh", "run_autograder", "course/pyproject.toml",
            "course/requirements/lock.txt", "course/course_utils/__init__.py"} <= names
    assert sorted(n for n in names if n.startswith("solutions/")) == [
        "solutions/00_setup_solutions.ipynb", "solutions/01_input_pipelines_solutions.ipynb"]
    assert mode & 0o111, "run_autograder must be executable"
    assert "requirements/lock.txt" in setup and "[grading]" in setup and "ipykernel" in setup
    with pytest.raises(ValueError, match="99"):
        gradescope.build_autograder(tmp_path / "b.zip", REPO / "solutions", ["99"])
    with pytest.raises(ValueError, match="visibility"):
        gradescope.build_autograder(tmp_path / "c.zip", REPO / "solutions", visibility="soon")


def test_canvas_export_has_one_column_per_notebook_and_points_possible(tmp_path):
    book = Gradebook(tmp_path / "gradebook.csv")
    book.add([Row("ana", "00_setup_exercises.ipynb", "check_a", 2, 2, PASSED),
              Row("ana", "00_setup_exercises.ipynb", "check_b", 0, 3, FAILED),
              Row("bo", "01_input_pipelines_exercises.ipynb", "check_c", 4, 4, PASSED),
              Row("", "stray.ipynb", "", 0, 0, "no student folder")])
    rows = canvas_rows(tmp_path / "gradebook.csv")
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       "00 setup", "01 input pipelines"]
    assert rows[1][0] == "Points Possible" and rows[1][5:] == ["5", "4"]
    assert rows[2] == ["ana", "", "", "ana", "", "2", ""]
    assert rows[3] == ["bo", "", "", "bo", "", "", "4"]
    assert write_canvas_csv(tmp_path / "gradebook.csv", tmp_path / "c.csv").is_file()
    with pytest.raises(FileNotFoundError):
        write_canvas_csv(tmp_path / "none.csv", tmp_path / "d.csv")


# --- the autograder, run ----------------------------------------------------------------------
# The whole course's autograder runs blank, partial and good submissions of every exercise
# notebook in test_grading_nbgrader.py, beside nbgrader on the same notebooks.

LIMITS = Limits(memory_gb=2, processes=128)  # lesson 00's autograder


@pytest.fixture(scope="module")
def lesson_00_autograder() -> Path:
    """Lesson 00's autograder with a short time limit, for the hostile submissions. The
    repository's own solutions folder is made private first, as a grader run as root leaves
    it: a clone is world-readable, and another test's process that names the clone on its
    command line (where the snooping submission looks) would hand it the answers."""
    (REPO / "solutions").chmod(0o700)
    yield from autograder_root(["00"], HOSTILE_TIMEOUT, LIMITS)


#: Scenario of make_submissions (lesson 00) -> the points it may get, of the total. Edited
#: checks, an endless loop and a fake course package are graded by the same grade_submission in
#: test_grading_grader.py (dave, test_endless_loop_..., the wrong_types_and_misbehaves student).
HOSTILE = {
    "segfault": lambda got, top: 0 < got < top,
    "invalid_json": lambda got, top: got == 0,
    "not_a_notebook": lambda got, top: got == 0,
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", HOSTILE)
def test_hostile_submissions_never_break_the_results(lesson_00_autograder, scenario):
    solution = nbformat.read(make_submissions.SOLUTION, as_version=4)
    text = make_submissions.SCENARIOS[scenario](solution)
    results = run_autograder(lesson_00_autograder, {make_submissions.NOTEBOOK: text})
    got, top = by_notebook(results)[make_submissions.NOTEBOOK.split("_exercises")[0]]
    assert HOSTILE[scenario](got, top), f"{scenario}: {got:g} of {top:g}\n{results['output']}"


@pytest.mark.slow
def test_an_empty_or_foreign_submission_gets_zero_and_says_why(lesson_00_autograder):
    results = run_autograder(lesson_00_autograder,
                             {"notes.txt": "hello", "my_homework.ipynb": "{}"})
    assert results["score"] == 0 and "not an exercise notebook" in results["output"]
    assert all("not submitted" in test["output"] for test in results["tests"])


def _alive(tag: str) -> list[str]:
    return [p.info["name"] for p in psutil.process_iter(["name"])
            if (p.info["name"] or "").startswith(f"cuh-{tag}")]


@pytest.mark.slow
@pytest.mark.skipif(not can_switch_user(), reason="the sandbox needs root (CI runs as root)")
@pytest.mark.parametrize("scenario", ["rewrites_grades", "snoops", "hogs"])
def test_attacks_on_the_results_fail_and_leave_no_process(lesson_00_autograder, scenario):
    root = lesson_00_autograder
    package = root / "source" / "course" / "course_utils"
    checks = package / "grading" / "checks" / "lesson_00.py"
    before = hashlib.sha256(checks.read_bytes()).hexdigest()
    make = {"rewrites_grades": lambda: make_submissions.rewrites_grades(
                "gs", (str(root / "results" / "results.json"),)),
            "snoops": lambda: make_submissions.snoops(
                "gs", (str(root / "submission"), str(root / "source" / "solutions"))),
            "hogs": lambda: make_submissions.hogs("gs", LIMITS.memory_gb, LIMITS.processes)}
    text = make[scenario]()(nbformat.read(make_submissions.SOLUTION, as_version=4))
    # valid: the grader's own results, not the attacker's file
    results = run_autograder(root, {make_submissions.NOTEBOOK: text})
    got, top = by_notebook(results)[make_submissions.NOTEBOOK.split("_exercises")[0]]
    assert results["score"] == sum(t["score"] for t in results["tests"]) == got
    assert _alive("gs") == [], "a process of the submission outlived the autograder"
    assert hashlib.sha256(checks.read_bytes()).hexdigest() == before
    assert list(package.glob("cuh_*.py")) == []
    if scenario == "hogs":  # 1 and 2 pass within the short time limit; the limit is named
        assert got >= 2 and "more than 2 GB of memory" in json.dumps(results), results["output"]
    else:
        assert got == 0, results["output"]
