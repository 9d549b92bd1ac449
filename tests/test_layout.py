"""The repository's promises: pinned dependencies in step, README commands, CI, Makefile."""

from __future__ import annotations

import pathlib
import re
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        assert version, f"{requirement!r} is not pinned with =="
        pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return pins


def _environment_pins() -> dict[str, str]:
    lines = (REPO / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    requirements = [line.strip()[2:] for line in lines[start + 1:]
                    if line.strip().startswith("- ")]
    return _pins(requirements)


def test_every_dependency_is_pinned_and_environment_yml_agrees():
    project = _pyproject()["project"]
    pinned = _pins(project["dependencies"] + project["optional-dependencies"]["dev"])
    assert _environment_pins() == pinned


def test_the_pins_are_the_course_stack():
    pins = _pins(_pyproject()["project"]["dependencies"])
    assert pins["tensorflow"].startswith("2.21.")
    assert pins["tf-keras"].startswith("2.21.")  # tf-keras must match TensorFlow's minor
    assert pins["keras"].startswith("3.")
    for needed in ("tensorflow-datasets", "importlib-resources", "tensorboard", "jupyterlab",
                   "ipywidgets", "nbclient", "portpicker", "psutil", "scikit-learn"):
        assert needed in pins, needed


def test_environment_yml_uses_the_same_python_as_the_readme():
    assert "python=3.11" in (REPO / "environment.yml").read_text()
    assert "3.11" in (REPO / "README.md").read_text()


def test_readme_gives_the_two_commands_first():
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block
    sections = readme.split("\n## ")
    assert "make lab" in sections[1] and "make test" in sections[1]  # the first section


def test_ci_runs_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert "make test" in commands
    assert "set -euo pipefail" in script


def test_makefile_has_the_targets_the_readme_names():
    makefile = (REPO / "Makefile").read_text()
    readme = (REPO / "README.md").read_text()
    targets = {name for names in re.findall(r"^([a-z][a-z ]*):", makefile, re.MULTILINE)
               for name in names.split()}
    for target in set(re.findall(r"`make ([a-z]+)", readme)):
        assert target in targets, f"README names make {target}, the Makefile lacks it"
    for target in ("lab", "test", "notebooks", "html", "exercises", "grade", "bench"):
        assert target in targets, target


def test_make_test_runs_every_check():
    makefile = (REPO / "Makefile").read_text()
    test_line = next(line for line in makefile.splitlines() if line.startswith("test:"))
    for step in ("lint", "stripped", "sync", "unit", "nbval"):
        assert step in test_line
    for folder in ("notebooks", "solutions", "exercises"):
        assert folder in makefile


def test_run_time_files_are_ignored():
    ignored = (REPO / ".gitignore").read_text()
    for pattern in (".venv/", "_build/", "checkpoints/", "logs/", "runs/", "gradebook*.csv"):
        assert pattern in ignored


def test_readme_links_point_at_files_that_exist():
    readme = (REPO / "README.md").read_text()
    for target in re.findall(r"\]\(((?:notebooks|exercises|solutions)/[^)]+)\)", readme):
        assert (REPO / target).exists(), f"README links to missing {target}"


def test_every_lesson_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    for lesson in (REPO / "notebooks").glob("*.ipynb"):
        assert f"(notebooks/{lesson.name})" in readme, f"{lesson.name} is not in the course map"
