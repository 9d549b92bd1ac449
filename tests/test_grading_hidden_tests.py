"""nbgrader's hidden tests: removed from exercises as nbgrader does, failing unsolved work."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

import course_utils as cu
from course_utils.grading.checks import registry
from course_utils.grading.framework import NotAttemptedError, stderr_to_stdout
from course_utils.instructor.assemble import prepare
from course_utils.instructor.cells import check_cells
from course_utils.instructor.generate import exercise_from_solution
from course_utils.instructor.hidden_tests import (
    HiddenTestsFormatError,
    check_cell_problems,
    check_cell_source,
    has_hidden_tests,
    strip_hidden_tests,
)

pytestmark = pytest.mark.usefixtures("normal_check_mode")
PACKAGE = Path(cu.__file__).resolve().parent


def stub(*args):
    raise NotImplementedError()


def _check_cell(source: str, grade_id: str = "check_a") -> nbformat.NotebookNode:
    meta = {"grade": True, "solution": False, "locked": True, "points": 1,
            "grade_id": grade_id, "schema_version": 3}
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})


@pytest.mark.parametrize(("source", "visible"), [
    ("a\n### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS", "a"),
    ("a\n### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS\nc", "a\nc"),
    ("x  # BEGIN HIDDEN TESTS here\nb\n  END HIDDEN TESTS!\nc\n", "c\n"),  # any line with it
    ("a\n### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS\n"
     "### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS\nc", "a\nc"),
    ("no markers\n", "no markers\n"),
])
def test_hidden_regions_are_removed_line_for_line_as_nbgrader_does(source, visible):
    assert strip_hidden_tests(source) == visible
    assert has_hidden_tests(source) is (source != visible)


@pytest.mark.parametrize("source", [
    "### BEGIN HIDDEN TESTS\na",
    "### BEGIN HIDDEN TESTS\n### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS",
    "a\n### END HIDDEN TESTS",
])
def test_unbalanced_or_nested_markers_are_rejected(source):
    with pytest.raises(HiddenTestsFormatError):
        strip_hidden_tests(source)


def test_the_check_cell_pattern_is_well_formed_and_its_visible_part_is_the_call():
    source = check_cell_source("check_global_batch_size", "global_batch_size")
    assert check_cell_problems(source) == []
    assert strip_hidden_tests(source) == "cu.grading.check_global_batch_size(global_batch_size)"


def test_a_check_cell_without_its_hidden_test_is_reported():
    problems = check_cell_problems("cu.grading.check_global_batch_size(global_batch_size)")
    assert problems == ['check_global_batch_size: add cu.grading.require_passed('
                        '"check_global_batch_size") between "### BEGIN HIDDEN TESTS" and '
                        '"### END HIDDEN TESTS"']
    wrong = check_cell_source("check_a", "a").replace('passed("check_a")', 'passed("check_b")')
    assert len(check_cell_problems(wrong)) == 2
    assert check_cell_problems("print(1)") == ["no check called in 'print(1)'"]
    assert check_cell_problems("### BEGIN HIDDEN TESTS") != []


def test_every_check_cell_of_every_solution_has_its_hidden_test(repo):
    for path in sorted((repo / "solutions").glob("*_solutions.ipynb")):
        for cell in check_cells(nbformat.read(str(path), as_version=4)):
            assert check_cell_problems(cell.source) == [], f"{path.name}: {cell.id}"


def test_exercises_lose_the_hidden_tests_and_keep_the_visible_check():
    source = check_cell_source("check_a", "a")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 07 · X: Solutions"),
                                         _check_cell(source)])
    exercise = exercise_from_solution(nb, "s", "e")
    assert exercise.cells[1].source == "cu.grading.check_a(a)"
    assert nb.cells[1].source == source  # the solution is not changed


def test_hidden_tests_outside_a_check_cell_are_rejected():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\nx = 1\n### END HIDDEN TESTS")])
    with pytest.raises(HiddenTestsFormatError, match="not a check cell"):
        exercise_from_solution(nb, "a", "b")


def test_require_passed_fails_a_stub_and_passes_a_solution(capsys, learner_diagnosis):
    assert cu.grading.check_diagnose_step(stub) is False
    with pytest.raises(NotAttemptedError, match="diagnose_step: not attempted"):
        cu.grading.require_passed("check_diagnose_step")
    def diagnose_step(*args, **kwargs):  # the learner's own function (as a solution is)
        return learner_diagnosis(*args, **kwargs)

    assert cu.grading.check_diagnose_step(diagnose_step)
    cu.grading.require_passed("check_diagnose_step")
    with pytest.raises(AssertionError):
        cu.grading.check_diagnose_step(lambda parts, whole_step: "input")
    with pytest.raises(AssertionError, match="has not run"):  # a failed check leaves no pass
        cu.grading.require_passed("check_diagnose_step")
    with pytest.raises(KeyError):
        cu.grading.require_passed("check_no_such_exercise")


def test_a_check_writes_nothing_to_stderr(capfd):
    @registry.register
    def check_noisy_exercise_for_this_test(fn):
        print("python warning", file=sys.stderr)
        os.write(2, b"native notice\n")
        return fn()

    try:
        assert check_noisy_exercise_for_this_test(lambda: True)
    finally:
        registry._CHECKS.pop("check_noisy_exercise_for_this_test")
    out, err = capfd.readouterr()
    assert err == "" and "python warning" in out and "native notice" not in out


def test_stderr_to_stdout_restores_stderr_after_the_block(capfd):
    with stderr_to_stdout():
        print("inside", file=sys.stderr)
    print("after", file=sys.stderr)
    out, err = capfd.readouterr()
    assert out == "inside\n" and err == "after\n"


def test_our_grader_does_not_call_an_untouched_check_cell_edited():
    source = check_cell_source("check_a", "a")
    solution = nbformat.v4.new_notebook(cells=[_check_cell(source)])
    submission = exercise_from_solution(solution, "s", "e")
    prepared = prepare(submission, solution, PACKAGE)
    assert prepared.notes == []
    assert prepared.notebook.cells[0].source.endswith(source)  # hidden test put back
    submission.cells[0].source = "pass"
    assert "edited" in prepare(submission, solution, PACKAGE).notes[0]
