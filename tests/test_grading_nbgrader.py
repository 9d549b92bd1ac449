"""Real nbgrader 0.9 and our Gradescope autograder on every exercise notebook: blank 0, good
full, partial between, and the two agree point for point.

nbgrader lives in its own environment (created once, cached under pytest's cache folder); it
executes the notebooks with a kernel of the course's own Python (TensorFlow, ``course_utils``
from this checkout). For every ``solutions/NN_name_solutions.ipynb`` (later lessons included
automatically) it builds an nbgrader course and runs ``generate_assignment`` (whose release
must equal our exercise notebook); three students' copies are made (blank, the first exercise
solved, all solved). The autograder that ``python -m course_utils gradescope build`` makes (its
``run_autograder`` runs our grader, as root with the sandbox user, as on Gradescope) grades the
blank and the solved copy of every lesson and the half-solved copy of the lessons in
``NBGRADER_SOLVED`` (no cell of them may raise outside the checks and the cells tagged
``raises-exception``: nbval's assertion, so that ``make nbval`` need not run the exercise
notebooks again), and its ``results.json`` is checked against Gradescope's documented
format; ``nbgrader autograde`` grades all three of the lessons in ``NBGRADER_SOLVED`` (every
lesson with ``make test-grading``), and the two must agree point for point. The executed copies
stand in for nbval of the solutions and the exercises (``make nbval-all`` runs both too). Our
batch grader's own scenarios run on lesson 00 in ``test_grading_grader.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from course_utils.grading.framework import STRICT_ENV
from course_utils.instructor.cells import grade_id, is_check_cell, is_solution_cell
from course_utils.instructor.generate import exercise_path_for, solution_notebooks
from course_utils.instructor.scoring import RAISED_OUTSIDE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "grading"))
from gradescope_run import autograder_root, by_notebook, run_autograder  # noqa: E402

STUDENTS = ("blank", "partial", "good")
GRADESCOPE_TIMEOUT = 300  # seconds per notebook in the whole course's autograder
#: The lessons nbgrader grades blank, half and fully solved; the Gradescope autograder grades
#: every lesson all three ways, and nbgrader's release of every lesson is compared with our
#: exercise notebook. nbgrader runs every notebook the same way (a fresh kernel, cell by cell),
#: so one lesson shows that its points and ours agree; each more lesson costs about 35 s of one
#: core. ``COURSE_NBGRADER_LESSONS=all`` (``make test-grading``) or a list ("01 04") widens it.
NBGRADER_SOLVED = os.environ.get("COURSE_NBGRADER_LESSONS", "00").split()


def _nbgrader_students(assignment: str) -> tuple[str, ...]:
    """The students whose copy of ``assignment`` nbgrader grades (none: nbgrader skips it)."""
    return STUDENTS if {"all", assignment[:2]} & set(NBGRADER_SOLVED) else ()


def _gradescope_students(assignment: str) -> tuple[str, ...]:
    """The students whose copy of ``assignment`` the Gradescope autograder grades: blank and
    good of every lesson, the half-solved copy of the lessons nbgrader grades. A half-solved
    copy runs what the blank and good copies run between them (its first exercise solved,
    the others blank) and cost a run of the whole course, about 50 s of 2 cores, for
    "partial between" on every lesson: ``make test-grading`` grades them all."""
    return STUDENTS if _nbgrader_students(assignment) else ("blank", "good")
NBGRADER = "nbgrader==0.9.*"
CELL_TIMEOUT = 600  # nbgrader's default is 30 s a cell; the README tells instructors the same
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name",
                  "Network is unreachable", "No matching distribution found",
                  "Could not find a version")
#: nbgrader's own API (``NbGraderAPI``, what its command line runs), in one process: it
#: releases every assignment (``generate``), says so, reads the students to grade from its
#: standard input (their copies are made from the release meanwhile), grades every submission
#: (``autograde``) and prints the gradebook's scores. A process per step cost about 4 CPU-s
#: of imports each.
NBGRADER_STEPS = """
import json, sys
from traitlets.config import Config
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
root, assignments = sys.argv[1], json.loads(sys.argv[2])
config = Config()
config.CourseDirectory.root = root
config.Execute.timeout = int(sys.argv[3])
api = NbGraderAPI(config=config)

def run(step, students):
    for assignment, names in students.items():
        for student in names or [None]:
            result = (api.generate_assignment(assignment, force=True) if step == "generate"
                      else api.autograde(assignment, student, force=True))
            if not result["success"]:
                sys.exit(f"nbgrader {step} {assignment} {student or ''}: {result['error']}"
                         f"\\n{result['log']}")

run("generate", dict.fromkeys(assignments, []))
print("generated", flush=True)
run("autograde", json.loads(sys.stdin.readline()))
scores = {}
with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
    for assignment in gb.assignments:
        for sub in gb.assignment_submissions(assignment.name):
            for nb in sub.notebooks:
                scores.setdefault(assignment.name, {})[sub.student.id] = {
                    "score": nb.score, "max": nb.max_score,
                    "cells": {g.name: g.score for g in nb.grades}}
print(json.dumps(scores))
"""

def _nbgrader_env(cache_dir: Path) -> Path:
    """A virtual environment with nbgrader 0.9 (reused when the cached one works)."""
    python = cache_dir / "bin" / "python"
    # its version read from the installed metadata: importing nbgrader costs about 4 CPU-s,
    # paid again when nbgrader's steps run (which fail with the reason if the copy is broken)
    probe = [str(python), "-c", "import importlib.metadata as m, importlib.util as u; "
             "assert u.find_spec('nbgrader') and m.version('nbgrader').startswith('0.9')"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return cache_dir
    shutil.rmtree(cache_dir, ignore_errors=True)
    subprocess.run(["python3", "-m", "venv", str(cache_dir)], check=True)
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", NBGRADER],
                             capture_output=True, text=True)
    if install.returncode != 0:
        shutil.rmtree(cache_dir, ignore_errors=True)
        if any(error in install.stderr for error in NETWORK_ERRORS):
            pytest.skip(f"the package registry cannot be reached to install {NBGRADER}: "
                        f"{install.stderr.strip().splitlines()[-1]}")
        raise RuntimeError(f"pip install {NBGRADER} failed:\n{install.stderr}")
    return cache_dir


def _course_kernel(jupyter_path: Path) -> None:
    """Kernel ``python3`` = the course's Python with this checkout's ``course_utils``."""
    spec = jupyter_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (course)", "language": "python",
        "env": {"PYTHONPATH": str(REPO)}}))


def _student_copy(release: nbformat.NotebookNode, solution: nbformat.NotebookNode,
                  solve: set[str]) -> nbformat.NotebookNode:
    """The released notebook with the solution cells whose grade_id is in ``solve`` answered."""
    answers = {grade_id(c): c.source for c in solution.cells if is_solution_cell(c)}
    nb = nbformat.from_dict(json.loads(json.dumps(release)))
    for cell in nb.cells:
        if is_solution_cell(cell) and grade_id(cell) in solve:
            cell.source = answers[grade_id(cell)]
    return nb


def _first_exercise(solution: nbformat.NotebookNode) -> set[str]:
    """The solution cells before the first check cell: solving them passes one check."""
    first = []
    for cell in solution.cells:
        if is_check_cell(cell):
            return set(first)
        if is_solution_cell(cell):
            first.append(grade_id(cell))
    raise AssertionError("no check cell")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    """Every exercise notebook graded by nbgrader and by our Gradescope autograder, three
    students each. nbgrader's environment is made (when the cached one is missing) while the
    Gradescope autograder grades: pip mostly waits on the registry."""
    started = time.monotonic()
    root = tmp_path_factory.mktemp("nbgrader")
    with ThreadPoolExecutor(1) as pool:
        nbgrader_env = pool.submit(_nbgrader_env,
                                   Path(request.config.cache.mkdir("nbgrader-0.9-env")))
        names, solves = {}, {}
        for path in solution_notebooks(REPO / "solutions"):
            name = exercise_path_for(path, Path()).name  # 00_setup_exercises.ipynb
            assignment = name.removesuffix("_exercises.ipynb")
            names[assignment] = (name, path)
            solution = nbformat.read(path, as_version=4)
            everything = {grade_id(c) for c in solution.cells if is_solution_cell(c)}
            solves[assignment] = {"blank": set(), "partial": _first_exercise(solution),
                                  "good": everything}
            ours = nbformat.read(REPO / "exercises" / name, as_version=4)  # nbgrader's release
            for student in STUDENTS:  # ... has the same code cells (asserted below)
                folder = root / "copies" / student
                folder.mkdir(parents=True, exist_ok=True)
                nbformat.write(_student_copy(ours, solution, solves[assignment][student]),
                               folder / name)
        setup_s = time.monotonic() - started
        ours_start = time.monotonic()
        ours_scores, tops, gradescope_output, gradescope_tests = _gradescope_grades(root, names)
        ours_s = time.monotonic() - ours_start
        env_dir = nbgrader_env.result()
    nbgrader_start = time.monotonic()
    course, notebooks, nbgrader_scores = _nbgrader_grades(root, env_dir, names, solves)
    nbgrader_s = time.monotonic() - nbgrader_start
    result = {"notebooks": notebooks, "nbgrader": nbgrader_scores, "ours": ours_scores,
              "gradescope_output": gradescope_output,
              "gradescope_tests": gradescope_tests, "course": course, "tops": tops,
              "seconds": {"setup": setup_s, "nbgrader": nbgrader_s, "ours": ours_s}}
    _report(result, request.config.cache)
    return result


def _gradescope_grades(root: Path, names: dict[str, tuple[str, Path]]) -> tuple[dict, ...]:
    """Our Gradescope autograder on every student's copies in ``root / "copies"``: points by
    assignment and student, the most possible by assignment, each run's output and tests."""
    ours: dict[str, dict[str, float]] = {}
    tops: dict[str, float] = {}
    output: dict[str, str] = {}
    tests: dict[str, list[dict]] = {}
    with contextmanager(autograder_root)([], GRADESCOPE_TIMEOUT) as autograder:
        for student in STUDENTS:
            files = {name: (root / "copies" / student / name).read_text()
                     for assignment, (name, _) in names.items()
                     if student in _gradescope_students(assignment)}
            results = run_autograder(autograder, files)
            output[student] = results["output"]
            tests[student] = results["tests"]
            for assignment, (got, top) in by_notebook(results).items():
                if student in _gradescope_students(assignment):  # the others: not submitted
                    ours.setdefault(assignment, {})[student] = got
                    tops[assignment] = top
    return ours, tops, output, tests


def _nbgrader_grades(root: Path, env_dir: Path, names: dict[str, tuple[str, Path]],
                     solves: dict[str, dict[str, set[str]]]) -> tuple[Path, dict, dict]:
    """nbgrader's course in ``root``: every assignment released (``generate_assignment``), the
    students of :func:`_nbgrader_students` submitted from the release and autograded. Returns
    the course folder, each release by assignment and nbgrader's scores."""
    course, jupyter = root / "course", root / "jupyter"
    _course_kernel(jupyter)
    env = {k: v for k, v in os.environ.items() if k not in (STRICT_ENV, "PYTHONPATH")}
    env.update(JUPYTER_PATH=str(jupyter), JUPYTER_CONFIG_DIR=str(root / "config"),
               JUPYTER_DATA_DIR=str(root / "data"), PATH=f"{env_dir / 'bin'}:{env['PATH']}")
    course.mkdir()

    for assignment, (name, path) in names.items():
        (course / "source" / assignment).mkdir(parents=True)
        shutil.copy(path, course / "source" / assignment / name)
    with (root / "nbgrader.log").open("w+") as log:
        steps = subprocess.Popen([str(env_dir / "bin" / "python"), "-c", NBGRADER_STEPS,
                                  str(course), json.dumps(list(names)), str(CELL_TIMEOUT)],
                                 cwd=course, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            generated = steps.stdout.readline().strip() == "generated"
            notebooks = {}
            for assignment, (name, path) in names.items() if generated else ():
                release = nbformat.read(course / "release" / assignment / name, as_version=4)
                solution = nbformat.read(path, as_version=4)
                for student in _nbgrader_students(assignment):
                    folder = course / "submitted" / student / assignment
                    folder.mkdir(parents=True)
                    nbformat.write(_student_copy(release, solution, solves[assignment][student]),
                                   folder / name)
                notebooks[assignment] = (name, release)
            students = {a: list(_nbgrader_students(a)) for a in notebooks
                        if _nbgrader_students(a)}
            out, _ = steps.communicate(json.dumps(students) + "\n" if generated else None)
        finally:
            if steps.poll() is None:
                steps.kill()
                steps.wait()
        log.seek(0)
        assert generated and steps.returncode == 0, f"nbgrader:\n{out}\n{log.read()}"
    scores = json.loads(out.strip().splitlines()[-1])
    return course, notebooks, scores


def _report(result: dict, cache: pytest.Cache) -> None:
    """Print the table of scores and times (and keep it in pytest's cache for the record)."""
    lines = ["notebook                     blank  partial  good  / max   (nbgrader | gradescope)"]
    for assignment in result["notebooks"]:
        nb, ours = result["nbgrader"].get(assignment, {}), result["ours"].get(assignment, {})
        cells = "  ".join(f"{nb[s]['score']:g}|{ours.get(s, float('nan')):g}" if s in nb
                          else f"-|{ours.get(s, float('nan')):g}" for s in STUDENTS)
        lines.append(f"{assignment:30s}  {cells}  / {result['tops'].get(assignment, 0):g}")
    seconds = result["seconds"]
    lines.append(f"time: set-up {seconds['setup']:.0f} s, nbgrader autograde "
                 f"{seconds['nbgrader']:.0f} s, Gradescope autograder {seconds['ours']:.0f} s")
    cache.set("nbgrader/report", lines)
    print("\n" + "\n".join(lines))


def test_every_exercise_notebook_is_graded(graded):
    keys = {p.name.removesuffix("_solutions.ipynb") for p in solution_notebooks(REPO / "solutions")}
    assert keys == set(graded["notebooks"]) == set(graded["ours"])
    assert set(graded["nbgrader"]) == {key for key in keys if _nbgrader_students(key)}
    assert {"00_setup", "01_input_pipelines", "02_mirrored_strategy"} <= keys


def test_nbgrader_release_code_equals_our_exercises(graded):
    for assignment, (name, release) in graded["notebooks"].items():
        ours = nbformat.read(REPO / "exercises" / name, as_version=4)
        theirs = {c.id: c.source for c in release.cells if c.cell_type == "code"}
        assert {c.id: c.source for c in ours.cells if c.cell_type == "code"} == theirs, assignment


def test_nbgrader_scores_blank_zero_good_full_partial_between(graded):
    assert graded["nbgrader"], "nbgrader graded no lesson"
    for assignment, students in graded["nbgrader"].items():
        assert set(students) == set(STUDENTS), assignment
        blank, partial, good = (students[s] for s in STUDENTS)
        assert blank["score"] == 0 < blank["max"] == graded["tops"][assignment], (
            assignment, blank["cells"])
        assert good["score"] == good["max"] > 0, (assignment, good["cells"])
        assert 0 < partial["score"] < partial["max"], (assignment, partial["cells"])


def test_the_gradescope_autograder_scores_blank_zero_partial_between_good_full(graded):
    tops = graded["tops"]
    for assignment, students in graded["ours"].items():
        top = tops[assignment]
        expected = {"blank": students["blank"] == 0, "good": students["good"] == top,
                    "partial": 0 < students.get("partial", top / 2) < top}
        assert set(students) == set(_gradescope_students(assignment)), assignment
        for student, right in expected.items():
            assert right, (f"{assignment}: {students[student]:g} of {top:g} for a {student} "
                           f"submission\n{_short_of_full(graded, student, assignment)}"
                           f"{graded['gradescope_output'][student][-2000:]}")


def _short_of_full(graded: dict, student: str, assignment: str) -> str:
    """What each of ``assignment``'s Gradescope tests said where it got less than full marks
    (a solved notebook that loses a point names the check and its message)."""
    return "".join(f"{test['name']}: {test['score']:g} of {test['max_score']:g}\n"
                   f"{test.get('output', '')[-1500:]}\n"
                   for test in graded["gradescope_tests"][student]
                   if test["name"].split(" · ")[0] == assignment
                   and test["score"] < test["max_score"])


def test_the_executed_notebooks_raise_only_in_check_cells_and_never_when_solved(graded):
    """What ``nbval`` of the solutions would catch, read off nbgrader's executed copies of the
    lessons of ``NBGRADER_SOLVED``: a solved notebook raises nowhere, a blank one only in its
    check cells and the cells tagged ``raises-exception`` (those that call an unanswered
    function). The Gradescope runs assert the same of every lesson
    (``test_no_gradescope_run_raised_outside_its_checks``); ``make nbval-all`` runs every
    exercise and solution notebook under nbval."""
    course = graded["course"]
    for assignment, (name, _) in graded["notebooks"].items():
        for student in sorted({"blank", "good"} & set(_nbgrader_students(assignment))):
            executed = nbformat.read(course / "autograded" / student / assignment / name,
                                     as_version=4)
            for index, cell in enumerate(executed.cells):
                errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
                allowed = is_check_cell(cell) or "raises-exception" in cell.metadata.get(
                    "tags", [])
                if errors and (student == "good" or not allowed):
                    raise AssertionError(
                        f"{assignment}, {student}: cell {index} ({grade_id(cell) or cell.id}) "
                        f"raised {errors[0].ename}: {errors[0].evalue}")


def test_no_gradescope_run_raised_outside_its_checks(graded):
    """nbval's assertion, on the Gradescope autograder's own runs: in every lesson's blank
    (the exercise notebook as committed) and solved notebook, and the half-solved ones it
    graded, no cell raised but
    the check cells and the cells tagged ``raises-exception`` (the grader names any other in
    the first test's output). ``make nbval`` therefore runs only the lessons."""
    raised = [f"{student}: {test['name']}: {test.get('output', '')[:600]}"
              for student, tests in graded["gradescope_tests"].items() for test in tests
              if RAISED_OUTSIDE in test.get("output", "")]
    assert raised == [], "\n".join(raised)
    assert all(len(tests) >= len(graded["notebooks"]) for tests in
               graded["gradescope_tests"].values())  # every notebook graded, each time


def test_our_grader_agrees_with_nbgrader(graded):
    for assignment, students in graded["nbgrader"].items():
        for student, theirs in students.items():
            ours = graded["ours"][assignment][student]
            assert ours == theirs["score"], (
                f"{assignment}, {student}: Gradescope {ours:g}, nbgrader {theirs['score']:g} "
                f"(nbgrader's cells: {theirs['cells']})\n"
                f"{graded['gradescope_output'][student][-3000:]}")
