"""The repository's promises: ranges, lock and environment.yml in step; README, CI, Makefile."""

from __future__ import annotations

import ast
import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        assert version, f"{requirement!r} is not pinned with =="
        pins[canonicalize_name(name.strip())] = version.strip()
    return pins


def _lock_pins() -> dict[str, str]:
    lines = (REPO / "requirements" / "lock.txt").read_text().splitlines()
    return _pins([line for line in lines if line.strip() and not line.startswith("#")])


def _environment_lines() -> list[str]:
    lines = (REPO / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    return [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")]


def _direct_requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in project["dependencies"] + extras]


def test_runtime_dependencies_are_ranges_without_front_ends_or_test_tools():
    project = _pyproject()["project"]
    runtime = {_name(r): Requirement(r) for r in project["dependencies"]}
    for requirement in runtime.values():
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), (
            f"{requirement} is an exact pin: on Colab pip would replace the runtime's own")
    for absent in ("jupyterlab", "notebook", "nbclient", "nbconvert", "pytest", "nbval", "ruff"):
        assert absent not in runtime, f"{absent} is not a runtime dependency of course_utils"
    assert set(project["optional-dependencies"]) == {"lab", "grading", "dev", "book"}
    assert "jupyterlab" in {_name(r) for r in project["optional-dependencies"]["lab"]}


def test_ranges_include_colabs_versions():
    runtime = {_name(r): Requirement(r) for r in _pyproject()["project"]["dependencies"]}
    colab_lines = (REPO / "requirements" / "colab.txt").read_text().splitlines()
    colab = _pins([line for line in colab_lines if line.strip() and not line.startswith("#")])
    for name, version in {"tensorflow": "2.20.0", "keras": "3.13.2",
                          "ipywidgets": "7.7.1"}.items():
        assert colab[name] == version  # Colab's runtime versions, requirements/colab.txt
    assert colab["tf-keras"].startswith("2.20.")  # tf-keras matches TensorFlow's minor version
    for name, requirement in runtime.items():
        if name in colab:
            assert requirement.specifier.contains(colab[name]), (
                f"Colab's {name} {colab[name]} is outside {requirement}: pip would replace it")
    for name in ("ipywidgets", "ipykernel"):  # both major versions: Colab's and the course's
        assert runtime[name].specifier.contains("8.1.0" if name == "ipywidgets" else "7.0.0")


def test_every_dependency_is_locked_inside_its_range():
    lock = _lock_pins()
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement} is not pinned in requirements/lock.txt"
        assert requirement.specifier.contains(lock[name]), (
            f"the lock pins {name}=={lock[name]}, outside pyproject's {requirement}")


def test_environment_yml_pins_the_direct_dependencies_as_the_lock_does():
    lines = _environment_lines()
    assert "-c requirements/lock.txt" in lines  # the other packages come from the lock
    pinned = _pins([line for line in lines if not line.startswith("-")])
    lock = _lock_pins()
    assert set(pinned) == {canonicalize_name(r.name) for r in _direct_requirements()}
    assert pinned == {name: lock[name] for name in pinned}


def test_the_lock_is_the_course_stack():
    lock = _lock_pins()
    assert lock["tensorflow"].startswith("2.21.")
    assert lock["tf-keras"].startswith("2.21.")  # tf-keras must match TensorFlow's minor
    assert lock["keras"].startswith("3.")
    for needed in ("tensorflow-datasets", "importlib-resources", "tensorboard", "jupyterlab",
                   "ipywidgets", "nbclient", "portpicker", "psutil", "pyyaml"):
        assert needed in lock, needed
    # Keras imports scikit-learn on every `import tensorflow` when it is installed, about a
    # CPU-second per process: the course ships its digits instead of depending on it.
    assert "scikit-learn" not in lock


def test_makefile_installs_with_the_lock():
    makefile = (REPO / "Makefile").read_text()
    assert "LOCK         = requirements/lock.txt" in makefile
    stamp_rule = next(line for line in makefile.splitlines() if line.startswith("$(STAMP):"))
    assert "$(LOCK)" in stamp_rule and "pyproject.toml" in stamp_rule
    assert 'pip install --quiet -c $(LOCK) -e ".[lab,grading,dev,book]"' in makefile


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
    targets = {name for names in re.findall(r"^([a-z][a-z -]*):", makefile, re.MULTILINE)
               for name in names.split()}
    for target in set(re.findall(r"`make ([a-z][a-z-]*)", readme)):
        assert target in targets, f"README names make {target}, the Makefile lacks it"
    for target in ("lab", "test", "book", "exercises", "grade", "bench"):
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
    for lesson in (REPO / "notebooks").glob("*.ipynb"):  # the appendices (A_name) too
        assert f"(notebooks/{lesson.name})" in readme, f"{lesson.name} is not in the course map"


def test_appendix_rows_follow_the_lessons_and_link_no_exercises():
    course_map = (REPO / "README.md").read_text().split("\n## The course\n")[1].split("\n#")[0]
    rows = [line for line in course_map.splitlines() if re.match(r"^\| (\d\d|[A-Z]) \|", line)]
    kinds = ["appendix" if row.split("|")[1].strip().isalpha() else "lesson" for row in rows]
    assert "appendix" in kinds and kinds == sorted(kinds, key=["lesson", "appendix"].index)
    assert all("exercises/" not in row for row, kind in zip(rows, kinds, strict=True)
               if kind == "appendix")  # an appendix has no exercises


def test_every_course_utils_module_is_small_and_declares_all():
    # The house rules, package-wide: no module over 450 lines, no class over 300, and an
    # explicit public face (__all__) in every module (the command line's __main__ aside).
    for path in sorted((REPO / "course_utils").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        source = path.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 450, f"{name}: {len(source.splitlines())} lines"
        tree = ast.parse(source)
        if path.name != "__main__.py":
            assert any(isinstance(node, ast.Assign)
                       and any(getattr(t, "id", "") == "__all__" for t in node.targets)
                       for node in tree.body), f"{name} has no __all__"
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                assert length <= 300, f"{name}: class {node.name} has {length} lines"
