"""The batch grader: discovery, restoring checks, the gradebook, and one real batch of bad and
good submissions executed in fresh kernels (about a minute on 2 cores with --jobs 2). As root,
the batch also holds three hostile submissions (a detached process that rewrites the
gradebook; one that reads the solutions and the other submissions and writes into the course
package; one that allocates past the memory limit and starts a flood of processes): each fails
harmlessly, every other row stays exact and no process of theirs survives."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_utils.instructor import cli
from course_utils.instructor.assemble import prepare
from course_utils.instructor.batch import grade_folder
from course_utils.instructor.cells import grade_id, notebook_key
from course_utils.instructor.gradebook import COLUMNS, Gradebook, Row, read_rows
from course_utils.instructor.limits import Limits
from course_utils.instructor.sandbox import PACKAGE_DIR
from course_utils.instructor.sandbox_user import can_switch_user
from course_utils.instructor.submissions import find_submissions, pick_latest, safe_name

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_setup_exercises.ipynb"
CHECKS = ["check_diagnose_step", "check_split_cpu", "check_step_breakdown",
          "check_overlapped_pipeline"]
MAX = {"check_diagnose_step": 1, "check_split_cpu": 1, "check_step_breakdown": 1,
       "check_overlapped_pipeline": 2}
TIMEOUT = 180  # per notebook: generous, so that a loaded machine does not time passes out
#: The endless loop's limit: its loop spins a core until then (the checks before it may pass or
#: time out, both allowed).
LOOP_LIMIT = 10


def _load_builder():
    path = REPO / "tests" / "fixtures" / "grading" / "make_submissions.py"
    spec = importlib.util.spec_from_file_location("grading_make_submissions", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ms = _load_builder()


def _solution():
    return nbformat.read(str(REPO / "solutions" / "00_setup_solutions.ipynb"), as_version=4)


# --- fast unit tests ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key"), [
    ("00_setup_exercises.ipynb", "00_setup"), ("00_setup_solutions.ipynb", "00_setup"),
    ("00_setup_exercises (1).ipynb", "00_setup"), ("00_setup_exercises-Copy1.ipynb", "00_setup"),
    ("00_Setup_Exercises.ipynb", "00_setup"), ("homework.ipynb", None), ("0_setup.ipynb", None),
])
def test_notebook_names_map_to_course_notebooks(name, key):
    assert notebook_key(name) == key


def test_safe_names_are_ascii_distinct_and_stable():
    names = ["José Müller", "Jose Muller", "a b", "a_b", "../../etc", "李雷", "O'Brien; rm -rf /"]
    safe = [safe_name(n) for n in names]
    assert len(set(safe)) == len(names)
    assert all(s.isascii() and "/" not in s and " " not in s and not s.startswith(".")
               for s in safe)
    assert safe_name("José Müller") == safe[0]


def test_both_layouts_are_found_and_the_newest_duplicate_is_kept(tmp_path):
    old = ms.write(tmp_path, "alice", "good", name="00_setup_exercises (1).ipynb")
    ms.age(old, 3600)
    new = ms.write(tmp_path, "alice", "good")
    nbg = ms.write(tmp_path, "bob", "good", assignment="00_setup")
    (tmp_path / "stray.ipynb").write_text("{}")
    (tmp_path / "bob" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "bob" / ".ipynb_checkpoints" / NOTEBOOK).write_text("{}")
    found, stray = find_submissions(tmp_path)
    assert stray == [tmp_path / "stray.ipynb"]
    kept, dropped = pick_latest(found)
    assert [(s.student, s.path) for s in kept] == [("alice", new), ("bob", nbg)]
    assert [(d.path, k.path) for d, k in dropped] == [(old, new)]


def test_edited_deleted_and_moved_checks_are_restored_after_their_exercise():
    solution = _solution()
    tampered = nbformat.reads(ms.tampered(solution), as_version=4)
    prepared = prepare(tampered, solution, PACKAGE_DIR)
    assert [c.grade_id for c in prepared.checks] == CHECKS
    for check in prepared.checks:
        source = prepared.notebook.cells[check.cell_index].source
        assert source.endswith(next(c.source for c in solution.cells  # hidden tests included
                                    if grade_id(c) == check.grade_id))
        assert "set_strict(True)" in source and 'print("✅ passed")' not in source
        assert grade_id(prepared.notebook.cells[check.cell_index - 1]) == check.grade_id[6:]
    assert sum("was edited" in note for note in prepared.notes) == len(CHECKS)

    moved = nbformat.reads(ms.deleted_and_reordered(solution), as_version=4)
    prepared = prepare(moved, solution, PACKAGE_DIR)
    assert sorted(c.grade_id for c in prepared.checks) == sorted(CHECKS)
    for check in prepared.checks:  # each check right after its own exercise
        assert grade_id(prepared.notebook.cells[check.cell_index - 1]) == check.grade_id[6:]
    assert sum("was missing" in note for note in prepared.notes) == len(CHECKS)
    assert prepared.notebook.cells[0].source == next(
        c.source for c in solution.cells if grade_id(c) == "setup")


def test_a_locked_cell_goes_back_after_the_ungraded_cells_it_follows():
    # Lesson 04: the locked cell that starts the cluster reads the parameters cell above it.
    solution = nbformat.read(REPO / "solutions" / "04_parameter_server_solutions.ipynb", 4)
    exercises = nbformat.read(REPO / "exercises" / "04_parameter_server_exercises.ipynb", 4)
    prepared = prepare(exercises, solution, PACKAGE_DIR)
    ids = [cell.get("id") for cell in prepared.notebook.cells]
    keys = [grade_id(cell) for cell in prepared.notebook.cells]
    parameters = next(i for i, cell in enumerate(prepared.notebook.cells)
                      if "parameters" in cell.get("metadata", {}).get("tags", []))
    assert keys.index("setup") < parameters < keys.index("cluster"), ids


def test_cells_that_raised_outside_the_checks_are_named_on_the_first_row():
    from course_utils.instructor.assemble import CheckSpec, Prepared
    from course_utils.instructor.scoring import RAISED_OUTSIDE, score

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1 / 0"),
        nbformat.v4.new_code_cell("answer()", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell("check_a(answer)"),
        nbformat.v4.new_code_cell("check_b(answer)")])
    prepared = Prepared(nb, [CheckSpec("a", 1, 2), CheckSpec("b", 1, 3)])
    error = {"status": "error", "ename": "NotImplementedError", "evalue": ""}
    result = {"status": "ok", "cells": [
        {"index": 0, "status": "error", "ename": "ZeroDivisionError", "evalue": "division by zero"},
        {"index": 1, **error}, {"index": 2, **error, "ename": "NotAttemptedError"},
        {"index": 3, "status": "ok"}]}
    first, second = score(prepared, result, 10, "ana", "00_setup_exercises.ipynb")
    assert first.feedback.endswith(f"NotImplementedError. {RAISED_OUTSIDE} the cell "
                                   "'x = 1 / 0' raised ZeroDivisionError: division by zero")
    assert "answer()" not in first.feedback and RAISED_OUTSIDE not in second.feedback
    result["cells"][0] = {"index": 0, "status": "ok"}
    assert RAISED_OUTSIDE not in score(prepared, result, 10, "ana", "x")[0].feedback


def test_gradebook_appends_drops_a_half_written_line_and_forces(tmp_path):
    out = tmp_path / "gradebook.csv"
    book = Gradebook(out)
    book.add([Row("Zoë, \"Z\"", NOTEBOOK, "check_a", 1, 1, "passed", "line one\nline two")])
    with out.open("a", encoding="utf-8") as handle:
        handle.write('bob,00_setup_exercises.ipynb,check_a,0')  # killed mid-write
    rows = read_rows(out)
    assert [(r.student, r.points, r.feedback) for r in rows] == [
        ("Zoë, \"Z\"", 1.0, "line one\nline two")]
    Gradebook(out).add([Row("bob", NOTEBOOK, "check_a", 0, 1, "failed")])
    assert [r.student for r in read_rows(out)] == ["Zoë, \"Z\"", "bob"]
    Gradebook(out, drop_keys={("bob", NOTEBOOK)})
    assert [r.student for r in read_rows(out)] == ["Zoë, \"Z\""]
    assert out.read_text(encoding="utf-8").splitlines()[0] == ",".join(COLUMNS)


def test_unreadable_and_unknown_submissions_get_rows_without_a_kernel(tmp_path):
    subs = tmp_path / "subs"
    ms.write(subs, "ivan", "invalid_json")
    ms.write(subs, "judy", "not_a_notebook")
    ms.write(subs, "peggy", "good", name="99_unknown_exercises.ipynb")
    (subs / "kim").mkdir()
    (subs / "kim" / NOTEBOOK).write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    out = tmp_path / "gradebook.csv"
    argv = ["grade", str(subs), "--solutions", str(REPO / "solutions"), "--out", str(out),
            "--quiet"]
    start = time.monotonic()
    assert cli.main(argv) == 1  # some submissions could not be graded
    assert time.monotonic() - start < 20
    rows = read_rows(out)
    status = {(r.student, r.exercise): r.status for r in rows}
    assert {status[("ivan", c)] for c in CHECKS} == {"invalid notebook"}
    assert {status[("judy", c)] for c in CHECKS} == {"invalid notebook"}
    assert {status[("kim", c)] for c in CHECKS} == {"invalid notebook"}
    assert status[("peggy", "")] == "unknown notebook"
    assert "not valid JSON" in next(r.feedback for r in rows if r.student == "ivan")
    assert sum(r.max_points for r in rows if r.student == "ivan") == 5
    # --force grades again and replaces the rows instead of adding more
    assert cli.main([*argv, "--force"]) == 1
    assert len(read_rows(out)) == len(rows)


def test_a_folder_the_user_may_not_read_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    # as root every folder is readable, so the refusal a normal user meets (the solutions left
    # private by a grader run as root) is simulated
    subs = tmp_path / "subs"
    subs.mkdir()
    solutions = REPO / "solutions"
    monkeypatch.setattr(cli.os, "access", lambda path, mode: Path(path) != solutions)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["grade", str(subs), "--solutions", str(solutions), "--quiet"])
    assert exit_.value.code == 2
    assert f"{solutions}: you may not read this folder" in capsys.readouterr().err


def test_rows_of_a_grader_error_are_graded_again_on_resume(tmp_path):
    subs = tmp_path / "subs"
    ms.write(subs, "ivan", "invalid_json")
    out = tmp_path / "gradebook.csv"
    Gradebook(out).add([Row("ivan", NOTEBOOK, c, 0, MAX[c], "grader error", "boom")
                        for c in CHECKS])
    result = grade_folder(subs, REPO / "solutions", out, progress=False)
    assert result.skipped == 0
    assert {r.status for r in read_rows(out)} == {"invalid notebook"}
    assert len(read_rows(out)) == len(CHECKS)


# --- one real batch -----------------------------------------------------------------------

CLASS = {  # student folder -> scenario of make_submissions.py
    "alice": "good",
    "carol": "partial",
    "dave": "tampered",
    "grace": "exits_kernel",
    "Zoë O'Brien-Łukasz (2nd try)": "wrong_types_and_misbehaves",
    "ivan": "invalid_json",
}
ODD = "Zoë O'Brien-Łukasz (2nd try)"
#: Hostile submissions, graded as root only (they would do harm without the sandbox).
HOSTILE = ["mallory", "oscar", "peggy"] if can_switch_user() else []
LIMITS = Limits(memory_gb=2, processes=128)
CHECKS_FILE = PACKAGE_DIR / "grading" / "checks" / "lesson_00.py"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hostile_alive(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "").startswith(f"cuh-{tag}"):
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def batch():
    # A folder other users may enter, as an instructor's usually is: the grader must make the
    # submissions, solutions, gradebook and feedback private itself.
    root = Path(tempfile.mkdtemp(prefix="cu-grading-test-"))
    root.chmod(0o755)
    try:
        yield _grade_batch(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _grade_batch(root: Path) -> dict:
    subs = root / "submitted"
    for student, scenario in CLASS.items():
        ms.write(subs, student, scenario)
    out, feedback = root / "gradebook.csv", root / "feedback"
    solution = nbformat.read(str(ms.SOLUTION), as_version=4)
    hostile = {"mallory": ms.rewrites_grades("gr", (str(out),)),
               "oscar": ms.snoops("gr", (str(subs), str(REPO / "solutions"))),
               "peggy": ms.hogs("gr", LIMITS.memory_gb, LIMITS.processes)}
    for student in HOSTILE:
        (subs / student).mkdir(parents=True)
        (subs / student / NOTEBOOK).write_text(hostile[student](solution), encoding="utf-8")
    package_before = _digest(CHECKS_FILE)
    # bob hands in the committed exercise notebook untouched
    (subs / "bob").mkdir()
    shutil.copy(REPO / "exercises" / NOTEBOOK, subs / "bob" / NOTEBOOK)
    # eve uses nbgrader's layout, deleted her checks, reordered her exercises, and her front
    # end dropped the cell metadata
    ms.write(subs, "eve", "moved_and_stripped", assignment="00_setup")
    # alice also handed in an older copy
    ms.age(ms.write(subs, "alice", "unsolved", name="00_setup_exercises (1).ipynb"), 3600)
    seen: list[list[Row]] = []
    start = time.monotonic()
    private_tmp, saved_tmp = root / "tmp", tempfile.tempdir  # this batch's folders only
    private_tmp.mkdir()
    tempfile.tempdir = str(private_tmp)
    try:
        result = grade_folder(subs, REPO / "solutions", out, feedback_dir=feedback,
                              timeout=TIMEOUT, jobs=2, progress=False, on_rows=seen.append,
                              limits=LIMITS)
    finally:
        tempfile.tempdir = saved_tmp
    return {"root": root, "subs": subs, "out": out, "feedback": feedback, "result": result,
            "seen": seen, "seconds": time.monotonic() - start, "tmp": private_tmp,
            "alive": _hostile_alive("gr"),
            "package_changed": _digest(CHECKS_FILE) != package_before,
            "planted": list(PACKAGE_DIR.glob("cuh_*.py"))}


def _rows(batch, student):
    return {r.exercise: r for r in read_rows(batch["out"]) if r.student == student}


@pytest.mark.slow
def test_solution_gets_full_marks(batch):
    rows = _rows(batch, "alice")
    assert {e: (r.points, r.status) for e, r in rows.items() if e} == {
        c: (MAX[c], "passed") for c in CHECKS}


@pytest.mark.slow
def test_committed_exercises_score_zero_not_attempted(batch):
    rows = _rows(batch, "bob")
    assert {e: (r.points, r.status) for e, r in rows.items()} == {
        c: (0, "not attempted") for c in CHECKS}


@pytest.mark.slow
def test_partial_submission_gets_partial_credit_and_feedback(batch):
    rows = _rows(batch, "carol")
    assert [rows[c].status for c in CHECKS] == ["passed", "passed", "failed", "not attempted"]
    assert "expected" in rows["check_step_breakdown"].feedback
    assert sum(r.points for r in rows.values()) == 2


@pytest.mark.slow
def test_tampered_checks_are_restored_and_monkeypatching_gains_nothing(batch):
    rows = _rows(batch, "dave")
    assert {r.status for r in rows.values()} == {"not attempted"}
    assert all("was edited" in r.feedback for r in rows.values())


@pytest.mark.slow
def test_deleted_reordered_and_stripped_checks_are_put_back_in_nbgrader_layout(batch):
    rows = _rows(batch, "eve")
    assert {r.status for r in rows.values()} == {"passed"}
    assert sum(r.points for r in rows.values()) == 5


@pytest.mark.slow
def test_endless_loop_times_out_and_the_worker_is_killed(tmp_path):
    subs = tmp_path / "subs"
    ms.write(subs, "frank", "endless_loop")
    out = tmp_path / "gradebook.csv"
    start = time.monotonic()
    grade_folder(subs, REPO / "solutions", out, timeout=LOOP_LIMIT, progress=False)
    assert time.monotonic() - start < LOOP_LIMIT + 15
    rows = {r.exercise: r for r in read_rows(out)}
    assert [rows[c].status for c in CHECKS[2:]] == ["timeout", "timeout"]
    assert {rows[c].status for c in CHECKS[:2]} <= {"passed", "timeout"}  # a slow start
    assert f"time limit of {LOOP_LIMIT} s" in rows["check_overlapped_pipeline"].feedback


@pytest.mark.slow
def test_kernel_death_keeps_earlier_results(batch):
    rows = _rows(batch, "grace")
    assert [rows[c].status for c in CHECKS] == ["passed", "passed", "kernel died", "kernel died"]


@pytest.mark.slow
def test_odd_name_exit_output_flood_files_chdir_and_fake_package_change_nothing(batch):
    rows = _rows(batch, ODD)
    assert [rows[c].status for c in CHECKS] == ["failed", "failed", "passed", "passed"]
    assert "diagnose_step: case" in rows["check_diagnose_step"].feedback
    assert "fresh process" in rows["check_split_cpu"].feedback
    assert not (REPO / "junk.bin").exists() and not (Path.cwd() / "junk.bin").exists()
    assert len(batch["out"].read_bytes()) < 50_000  # the 5 MB print was not kept
    page = batch["feedback"] / f"{safe_name(ODD)}.md"
    assert page.read_text(encoding="utf-8").startswith(f"# Feedback for {ODD}")


@pytest.mark.slow
def test_invalid_notebook_and_duplicate_get_rows_and_the_batch_goes_on(batch):
    assert {r.status for r in _rows(batch, "ivan").values()} == {"invalid notebook"}
    duplicate = [r for r in read_rows(batch["out"]) if r.status == "duplicate"]
    assert [r.student for r in duplicate] == ["alice"]
    assert "00_setup_exercises (1).ipynb" in duplicate[0].feedback
    assert {r.student for r in batch["result"].ungradable} == {"ivan"}


@pytest.mark.slow
def test_rows_are_written_as_soon_as_each_submission_is_graded(batch):
    sizes = [len({r.key for r in rows}) for rows in batch["seen"]]
    assert sizes and all(size == 1 for size in sizes)
    with batch["out"].open(encoding="utf-8", newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    students = {r.student for r in read_rows(batch["out"])}
    assert students == {*CLASS, *HOSTILE, "bob", "eve"}


@pytest.mark.slow
def test_no_worker_or_temporary_folder_is_left_behind(batch):
    mine = str(batch["tmp"])  # other tests may be grading in parallel: look at this batch only
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if any(mine in part for part in (p.info["cmdline"] or []))]
    assert leftovers == []
    assert list(batch["tmp"].iterdir()) == []


# --- hostile submissions (root: each notebook runs as its own sandbox user) -----------------

needs_root = pytest.mark.skipif(not HOSTILE, reason="the sandbox needs root (CI runs as root)")


@pytest.mark.slow
@needs_root
def test_the_batch_was_sandboxed_and_no_hostile_process_survives(batch):
    assert batch["result"].protection.sandboxed, batch["result"].protection.note
    assert batch["alive"] == [], "a process a submission started outlived the batch"
    assert _hostile_alive("gr") == []


@pytest.mark.slow
@needs_root
def test_a_detached_process_cannot_rewrite_the_gradebook(batch):
    rows = _rows(batch, "mallory")
    assert {e: (r.points, r.status) for e, r in rows.items()} == {
        c: (0, "not attempted") for c in CHECKS}
    assert batch["result"].tampered == []
    text = batch["out"].read_text(encoding="utf-8")
    assert text.count("mallory,") == len(CHECKS) and text.startswith(",".join(COLUMNS))
    assert batch["out"].stat().st_mode & 0o077 == 0  # the gradebook is the grader's only


@pytest.mark.slow
@needs_root
def test_other_submissions_the_solutions_and_the_course_package_are_out_of_reach(batch):
    rows = _rows(batch, "oscar")
    assert {e: (r.points, r.status) for e, r in rows.items()} == {
        c: (0, "not attempted") for c in CHECKS}
    assert not batch["package_changed"] and batch["planted"] == []
    for private in (batch["subs"], REPO / "solutions", batch["feedback"]):
        assert private.stat().st_mode & 0o077 == 0, private


@pytest.mark.slow
@needs_root
def test_memory_and_process_limits_are_named_and_cost_nothing_else(batch):
    rows = _rows(batch, "peggy")
    assert {e: (r.points, r.status) for e, r in rows.items()} == {
        c: (MAX[c], "passed") for c in CHECKS}
    feedback = rows["check_diagnose_step"].feedback
    assert "more than 2 GB of memory" in feedback, feedback
    assert "more than 128 processes" in feedback, feedback


@pytest.mark.slow
def test_resumed_run_grades_nothing_twice(batch):
    before = batch["out"].read_bytes()
    result = grade_folder(batch["subs"], REPO / "solutions", batch["out"], timeout=TIMEOUT,
                          jobs=2, progress=False)
    assert result.rows == [] and result.skipped == len(CLASS) + len(HOSTILE) + 2
    assert batch["out"].read_bytes() == before


@pytest.mark.slow
def test_interrupted_run_resumes_only_what_is_missing(batch, tmp_path):
    out = tmp_path / "gradebook.csv"
    rows = [r for r in read_rows(batch["out"]) if r.student != "ivan"]
    Gradebook(out).add(rows)
    with out.open("a", encoding="utf-8") as handle:
        handle.write("ivan,00_setup_exercises.ipynb,check_dia")  # killed mid-row
    start = time.monotonic()
    result = grade_folder(batch["subs"], REPO / "solutions", out, timeout=TIMEOUT, jobs=2,
                          progress=False)
    assert time.monotonic() - start < 20  # nothing was executed again
    assert {r.student for r in result.rows} == {"ivan"}
    assert len(read_rows(out)) == len(read_rows(batch["out"]))


@pytest.mark.slow
def test_batch_time_is_reported(batch, capsys):
    with capsys.disabled():
        print(f"\n[grader] {len(CLASS) + len(HOSTILE) + 2} submissions graded in "
              f"{batch['seconds']:.1f} s with --jobs 2")
    assert batch["seconds"] > 0
