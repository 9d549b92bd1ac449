"""Exercise generation: stubs, titles, badges, tags, determinism and the sync check."""

from __future__ import annotations

import shutil

import nbformat
import pytest

from course_utils.instructor import cli
from course_utils.instructor.cells import (
    check_cells,
    grade_id,
    is_solution_cell,
    nbgrader_meta,
    notebook_key,
)
from course_utils.instructor.generate import (
    SolutionFormatError,
    exercise_from_solution,
    generate,
    out_of_sync,
    strip_solution,
)

SOLUTION = "solutions/00_setup_solutions.ipynb"
EXERCISE = "exercises/00_setup_exercises.ipynb"


def test_solution_block_becomes_an_indented_stub():
    source = ("def f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    y = x + 1\n"
              "    return y\n    ### END SOLUTION\n")
    assert strip_solution(source) == ("def f(x):\n    \"\"\"Doc.\"\"\"\n    # YOUR CODE HERE\n"
                                      "    raise NotImplementedError()")


@pytest.mark.parametrize("source", [
    "### BEGIN SOLUTION\nx = 1\n",
    "x = 1\n### END SOLUTION\n",
    "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n",
])
def test_unbalanced_markers_are_rejected(source):
    with pytest.raises(SolutionFormatError):
        strip_solution(source)


def test_committed_exercises_are_in_sync_with_solutions(repo):
    assert out_of_sync(repo / "solutions", repo / "exercises") == []


def test_exercise_keeps_ids_and_metadata_and_rewrites_title_and_badge(repo):
    solution = nbformat.read(str(repo / SOLUTION), as_version=4)
    exercise = nbformat.read(str(repo / EXERCISE), as_version=4)
    assert [c.id for c in exercise.cells] == [c.id for c in solution.cells]
    assert [nbgrader_meta(c) for c in exercise.cells] == [nbgrader_meta(c) for c in solution.cells]
    title = exercise.cells[0].source
    assert title.startswith("# 00 · ") and "Exercises" in title.splitlines()[0]
    assert f"/blob/main/{EXERCISE})" in title and "solutions/" not in title
    text = nbformat.writes(exercise)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    for cell in exercise.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        if is_solution_cell(cell):
            assert "raise NotImplementedError()" in cell.source
    assert all("raises-exception" in c.metadata.get("tags", []) for c in check_cells(exercise))


def test_solutions_follow_the_grading_format(repo):
    for path in sorted((repo / "solutions").glob("*_solutions.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        assert notebook_key(path.name) == path.name[: -len("_solutions.ipynb")]
        ids = [grade_id(c) for c in nb.cells if grade_id(c)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate grade_id"
        for cell in nb.cells:
            assert "raises-exception" not in cell.metadata.get("tags", []), path.name
            meta = nbgrader_meta(cell)
            if meta:
                assert meta.get("schema_version") == 3 and grade_id(cell), path.name
                assert {"solution", "grade", "locked"} <= set(meta), path.name
        for cell in check_cells(nb):
            assert nbgrader_meta(cell)["points"] > 0 and nbgrader_meta(cell)["locked"]
        assert any(is_solution_cell(c) for c in nb.cells)


def test_cells_using_an_answer_are_tagged_and_plain_cells_are_not():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 07 · Thing: Solutions"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("def area(r):\n    ### BEGIN SOLUTION\n    return 3 * r\n"
                                  "    ### END SOLUTION",
                                  metadata={"nbgrader": {"grade_id": "area", "solution": True}}),
        nbformat.v4.new_code_cell("print(area(2))"),
        nbformat.v4.new_code_cell("print(x)"),
    ])
    ex = exercise_from_solution(nb, "solutions/a", "exercises/b")
    assert ex.cells[0].source == "# 07 · Thing: Exercises"
    assert ex.cells[3].metadata["tags"] == ["raises-exception"]
    assert "tags" not in ex.cells[1].metadata and "tags" not in ex.cells[4].metadata


def test_markers_outside_a_solution_cell_are_rejected():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")])
    with pytest.raises(SolutionFormatError, match="not marked as a solution"):
        exercise_from_solution(nb, "a", "b")


@pytest.fixture
def course(tmp_path, repo):
    shutil.copytree(repo / "solutions", tmp_path / "solutions")
    shutil.copytree(repo / "exercises", tmp_path / "exercises")
    return tmp_path


def _sync(course) -> int:
    return cli.main(["exercises", "--check", "--solutions", str(course / "solutions"),
                     "--exercises", str(course / "exercises")])


def test_sync_check_detects_a_drift_and_generation_fixes_it(course, capsys):
    assert _sync(course) == 0
    solution = course / SOLUTION
    nb = nbformat.read(str(solution), as_version=4)
    nb.cells[1].source += "\n\nA new sentence."
    nbformat.write(nb, str(solution))
    assert _sync(course) == 1
    assert "00_setup_exercises.ipynb: differs" in capsys.readouterr().err
    assert cli.main(["exercises", "--solutions", str(course / "solutions"),
                     "--exercises", str(course / "exercises")]) == 0
    assert _sync(course) == 0
    assert generate(course / "solutions", course / "exercises") == []  # deterministic


def test_sync_check_reports_missing_and_orphaned_exercises(course):
    (course / EXERCISE).rename(course / "exercises" / "99_gone_exercises.ipynb")
    problems = out_of_sync(course / "solutions", course / "exercises")
    assert any("00_setup_exercises.ipynb: missing" in p for p in problems)
    assert any("99_gone_exercises.ipynb: has no solution" in p for p in problems)
    assert _sync(course) == 1


def test_exercise_notebook_is_byte_identical_to_generated(repo, tmp_path):
    generate(repo / "solutions", tmp_path / "exercises")
    assert (tmp_path / EXERCISE).read_bytes() == (repo / EXERCISE).read_bytes()
