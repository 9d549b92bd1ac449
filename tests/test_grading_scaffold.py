"""``python -m course_utils new NN name "Title"``: a new lesson's files pass every check at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import notebooks
from course_utils.instructor.cells import check_cells, read_notebook
from course_utils.instructor.generate import out_of_sync
from course_utils.instructor.hidden_tests import check_cell_problems
from course_utils.instructor.scaffold import lesson_files, scaffold_lesson

REPO = Path(__file__).resolve().parents[1]
COPIED = ("course_utils", "tests", "solutions", "exercises", "notebooks", "conftest.py",
          "pyproject.toml")


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of the repository with lesson 98 scaffolded by the command line."""
    root = tmp_path_factory.mktemp("course")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / name)
    run = _run(root, "-m", "course_utils", "new", "98", "scaffold_demo", "Scaffold demo")
    assert run.returncode == 0, run.stderr
    return root


def _run(root: Path, *args: str, package: Path | None = None,
         **env: str) -> subprocess.CompletedProcess[str]:
    """Python in ``root`` with ``course_utils`` from ``package`` (default: ``root``'s own)."""
    environment = {**os.environ, "PYTHONPATH": str(package or root), **env}
    return subprocess.run([sys.executable, *args], cwd=root, env=environment,
                          capture_output=True, text=True)


def test_the_command_writes_every_file_of_the_lesson(course):
    files = lesson_files(course, "98", "scaffold_demo")
    assert all(path.is_file() for path in files.values())
    assert files["checks"].name == "lesson_98.py"
    assert files["tests"].name == "test_checks_lesson_98.py"


def test_the_notebooks_follow_the_conventions_and_exercises_are_in_sync(course):
    files = lesson_files(course, "98", "scaffold_demo")
    for role in ("lesson", "solutions", "exercises"):
        assert notebooks.convention_problems(files[role], course) == [], role
    assert out_of_sync(course / "solutions", course / "exercises") == []
    cells = check_cells(read_notebook(files["solutions"]))
    assert len(cells) == 1 and check_cell_problems(cells[0].source) == []


@pytest.mark.slow
def test_the_checks_module_registers_and_its_tests_pass(course):
    code = ("import course_utils as cu; "
            "print(cu.grading.check_scaffold_demo_steps_per_epoch.__module__)")
    assert _run(course, "-c", code).stdout.strip() == "course_utils.grading.checks.lesson_98"
    run = _run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "tests/test_checks_lesson_98.py", "tests/test_grading_registry.py")
    assert run.returncode == 0, run.stdout + run.stderr
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():  # the dev extra; .venv-colab has only the test runner
        return
    lint = subprocess.run([str(ruff), "check", "--no-cache",
                           "course_utils/grading/checks/lesson_98.py",
                           "tests/test_checks_lesson_98.py"], cwd=course, capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.slow
def test_the_solutions_notebook_runs_in_strict_mode(course):
    run = _run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
               "--nbval-current-env", "-p", "no:randomly",
               "solutions/98_scaffold_demo_solutions.ipynb", COURSE_STRICT_CHECKS="1")
    assert run.returncode == 0, run.stdout[-3000:]


def test_the_command_refuses_to_overwrite(course):
    checks = course / "course_utils/grading/checks/lesson_98.py"
    before = checks.read_text()
    run = _run(course, "-m", "course_utils", "new", "98", "scaffold_demo", "Another title")
    assert run.returncode == 1 and "not overwriting" in run.stderr
    assert checks.read_text() == before
    with pytest.raises(FileExistsError, match="lesson_98.py"):
        scaffold_lesson(course, "98", "scaffold_demo", "Title")


@pytest.mark.parametrize(("number", "name"), [("3", "x"), ("03", "Bad-Name"), ("03", "")])
def test_bad_numbers_and_names_are_refused(tmp_path, number, name):
    with pytest.raises(ValueError):
        lesson_files(tmp_path, number, name)


def test_the_old_one_notebook_form_still_works(tmp_path):
    run = _run(tmp_path, "-m", "course_utils", "new", "notebooks/05_tpus.ipynb", "TPUs",
               package=REPO)
    assert run.returncode == 0
    assert (tmp_path / "notebooks/05_tpus.ipynb").is_file()


def test_usage_is_printed_for_wrong_arguments(tmp_path):
    run = _run(tmp_path, "-m", "course_utils", "new", "03", package=REPO)
    assert run.returncode == 2 and "new NN name" in run.stderr


def test_the_title_defaults_to_the_name(tmp_path):
    run = _run(tmp_path, "-m", "course_utils", "new", "97", "two_args", package=REPO)
    assert run.returncode == 0, run.stderr
    files = lesson_files(tmp_path, "97", "two_args")
    assert all(path.is_file() for path in files.values())
    lesson = read_notebook(files["lesson"])
    assert lesson.cells[0].source.startswith("# 97 · Two args")
