"""A new lesson's files, ready to fill in: ``python -m course_utils new NN name "Title"``.

Writes, and refuses to overwrite any of them:

* ``notebooks/NN_name.ipynb``: the lesson skeleton (``course_utils.notebooks.new_notebook``);
* ``solutions/NN_name_solutions.ipynb``: one example exercise, a solution cell and its check
  cell with the hidden test (see ``hidden_tests``);
* ``exercises/NN_name_exercises.ipynb``: generated from the solutions notebook;
* ``course_utils/grading/checks/lesson_NN.py``: the example's check, registered by name;
* ``tests/test_checks_lesson_NN.py``: its tests (reference passes, wrong fails, stub skipped).

Each file follows the course's conventions from the start; replace the example with the
lesson's own exercises.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from course_utils.grading.checks import LESSON_PREFIX
from course_utils.instructor.cells import NBGRADER_SCHEMA, SOLUTION_SUFFIX
from course_utils.instructor.generate import render_exercise
from course_utils.instructor.hidden_tests import check_cell_source
from course_utils.notebooks import colab_badge, new_notebook, setup_cell_source

__all__ = ["lesson_files", "scaffold_lesson"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def lesson_files(root: Path, number: str, name: str) -> dict[str, Path]:
    """Where the files of lesson ``number`` called ``name`` go under the repository ``root``."""
    if not re.fullmatch(r"\d\d", number):
        raise ValueError(f"a lesson number has two digits, e.g. 03; got {number!r}")
    if not _NAME.match(name):
        raise ValueError(f"a lesson name is lower-case letters, digits and _, got {name!r}")
    stem = f"{number}_{name}"
    return dict(
        lesson=root / "notebooks" / f"{stem}.ipynb",
        solutions=root / "solutions" / f"{stem}{SOLUTION_SUFFIX}.ipynb",
        exercises=root / "exercises" / f"{stem}_exercises.ipynb",
        checks=root / "course_utils" / "grading" / "checks" / f"{LESSON_PREFIX}{number}.py",
        tests=root / "tests" / f"test_checks_{LESSON_PREFIX}{number}.py",
    )


def _nbgrader(grade_id: str, *, solution: bool = False, grade: bool = False,
              points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution,
            "schema_version": NBGRADER_SCHEMA, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _solutions_notebook(path: Path, root: Path, number: str, title: str,
                        function: str) -> nbformat.NotebookNode:
    v4 = nbformat.v4
    relative = path.resolve().relative_to(root.resolve())
    check = f"check_{function}"
    cells = [
        v4.new_markdown_cell(f"# {number} · {title}: Solutions\n\n{colab_badge(relative)}",
                             id="title"),
        v4.new_markdown_cell("## What you will learn\n\n- ...\n\n**Time:** ... minutes; runs on "
                             "a CPU-only laptop.", id="what-you-will-learn"),
        v4.new_markdown_cell("## Set-up", id="setup-md"),
        v4.new_code_cell(setup_cell_source(), id="setup", metadata=_nbgrader("setup")),
        v4.new_code_cell("# Sizes used below; change them and run the notebook again.\n"
                         "num_examples = 1_000\nglobal_batch_size = 64",
                         id="parameters", metadata={"tags": ["parameters"]}),
        v4.new_markdown_cell(
            "## Exercise 1 · Steps per epoch (1 point)\n\nAn epoch of `num_examples` in "
            "batches of `global_batch_size` takes how many steps? A last, partial batch is a "
            f"step too. Write `{function}`, then run the check below it.", id="ex1-md"),
        v4.new_code_cell(
            f"def {function}(num_examples: int, global_batch_size: int) -> int:\n"
            '    """Training steps in one epoch, the last partial batch included."""\n'
            "    ### BEGIN SOLUTION\n    return -(-num_examples // global_batch_size)\n"
            "    ### END SOLUTION", id=function, metadata=_nbgrader(function, solution=True)),
        v4.new_code_cell(check_cell_source(check, function), id=check,
                         metadata=_nbgrader(check, grade=True, points=1)),
        v4.new_markdown_cell("## Summary\n\n- ...", id="summary"),
    ]
    return v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}})


def _checks_module(number: str, title: str, function: str) -> str:
    return f'''"""Checks of lesson {number}'s exercises, registered by name with ``@register``.

Lesson: {title}.
"""

from __future__ import annotations

import math
from typing import Any

from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["check_{function}"]


@register
def check_{function}(fn: Any) -> bool:
    """Check ``{function}``: the steps of one epoch, rounded up."""
    rng = fresh_rng()
    pairs = [(10, 5), (11, 5)]
    pairs += [(rng.randint(1, 10_000), rng.randint(1, 512)) for _ in range(4)]
    cases = [Case(args=(examples, batch), expected=math.ceil(examples / batch))
             for examples, batch in pairs]
    return run_check("{function}", fn, cases,
                     hint="a last, partial batch is a step too: round up.")
'''


def _tests_module(number: str, function: str) -> str:
    module = f"{LESSON_PREFIX}{number}"
    return f'''"""Lesson {number}'s checks: reference passes, wrong answer fails, stub waits."""

from __future__ import annotations

import pytest

import course_utils as cu
from course_utils.grading.checks import {module}
from course_utils.grading.framework import NotAttemptedError, strict_checks

pytestmark = pytest.mark.usefixtures("normal_check_mode")


def {function}(num_examples, global_batch_size):
    return -(-num_examples // global_batch_size)


def stub(*args):
    raise NotImplementedError()


def test_{module}_registers_its_checks():
    for name in {module}.__all__:
        assert getattr(cu.grading, name) is getattr({module}, name)


def test_the_reference_solution_passes():
    assert cu.grading.check_{function}({function}) is True


def test_floor_division_fails_with_the_hint():
    with pytest.raises(AssertionError, match="round up"):
        cu.grading.check_{function}(lambda examples, batch: examples // batch)


def test_a_stub_is_not_attempted_and_fails_in_strict_mode(capsys):
    assert cu.grading.check_{function}(stub) is False
    assert "not attempted yet" in capsys.readouterr().out
    with strict_checks(), pytest.raises(NotAttemptedError):
        cu.grading.check_{function}(stub)
'''


def scaffold_lesson(root: Path, number: str, name: str, title: str) -> dict[str, Path]:
    """Write every file of a new lesson under ``root``; refuse if any of them exists."""
    files = lesson_files(root, number, name)
    existing = [str(path) for path in files.values() if path.exists()]
    if existing:
        raise FileExistsError(f"not overwriting: {', '.join(existing)}")
    function = f"{name}_steps_per_epoch"
    new_notebook(files["lesson"], title, root=root)
    files["solutions"].parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(_solutions_notebook(files["solutions"], root, number, title, function),
                   str(files["solutions"]))
    files["exercises"].parent.mkdir(parents=True, exist_ok=True)
    target, text = render_exercise(files["solutions"], files["exercises"].parent)
    target.write_text(text, encoding="utf-8")
    files["checks"].parent.mkdir(parents=True, exist_ok=True)
    files["checks"].write_text(_checks_module(number, title, function), encoding="utf-8")
    files["tests"].parent.mkdir(parents=True, exist_ok=True)
    files["tests"].write_text(_tests_module(number, function), encoding="utf-8")
    return files
