"""Habits: test tiers in the Makefile, the pre-commit hooks, and CONTRIBUTING.md."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
#: Tiers CONTRIBUTING.md names that other work adds to the Makefile.
TIERS_BUILT_ELSEWHERE = {"test-colab-stack", "test-browser"}


def _makefile_targets() -> dict[str, str]:
    """Target -> its prerequisites line and recipe."""
    text = (REPO / "Makefile").read_text()
    targets = {}
    for match in re.finditer(r"^([a-z][a-z -]*):(?!=)(.*(?:\n\t.*)*)", text, re.MULTILINE):
        for name in match.group(1).split():
            targets[name] = match.group(2)
    return targets


def test_slow_marker_is_registered():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    assert any(marker.startswith("slow:") for marker in config["ini_options"]["markers"])


def test_test_fast_runs_the_conventions_checks_and_the_fast_unit_tests():
    targets = _makefile_targets()
    assert targets["test-fast"].split("##")[0].split() == ["lint", "stripped", "sync",
                                                           "unit-fast"]
    assert '-m "not slow"' in targets["unit-fast"]


def test_make_test_still_runs_the_slow_tests():
    targets = _makefile_targets()
    for step in ("lint", "stripped", "sync", "unit-and-nbval"):
        assert step in targets["test"].split("##")[0].split()
    for target in ("unit", "unit-and-nbval"):
        recipe = targets[target].split("\n", 1)[1]
        assert "tests" in recipe.split() and "slow" not in recipe and '-m "' not in recipe
    assert "tests notebooks" in targets["unit-and-nbval"]  # the lessons too, in the same run
    # the one marker make test leaves out: a solution passing its check, which the Gradescope
    # run of every solution (in the same make test) asserts
    assert 'ALSO_GRADED = -m "not solution_passes"' in (REPO / "Makefile").read_text()


def test_pre_commit_hooks_are_the_versions_make_test_runs():
    for tool in ("ruff", "nbstripout"):  # the dev extra; .venv-colab has only the test runner
        try:
            importlib.metadata.version(tool)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{tool} is not installed here (dev extra)")
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    repos = {repo["repo"].rsplit("/", 1)[-1]: repo for repo in config["repos"]}
    assert repos["ruff-pre-commit"]["rev"] == "v" + importlib.metadata.version("ruff")
    assert repos["nbstripout"]["rev"] == importlib.metadata.version("nbstripout")
    assert [hook["id"] for hook in repos["ruff-pre-commit"]["hooks"]] == ["ruff-check"]
    assert repos["nbstripout"]["hooks"][0]["args"] == ["--keep-id"]  # as `make strip`
    local = repos["local"]["hooks"][0]
    assert local["entry"].endswith("-m course_utils exercises --check")  # as `make sync`
    assert "-m course_utils exercises --check" in _makefile_targets()["sync"]


def test_contributing_is_linked_and_names_only_real_targets():
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    assert "(CONTRIBUTING.md)" in (REPO / "README.md").read_text()
    named = set(re.findall(r"`make ([a-z-]+)", contributing))
    assert {"test-fast", "test", "test-busy"} <= named
    missing = named - set(_makefile_targets()) - TIERS_BUILT_ELSEWHERE
    assert not missing, f"CONTRIBUTING.md names make targets that do not exist: {missing}"


def test_contributing_describes_every_module_of_the_package():
    layout = (REPO / "CONTRIBUTING.md").read_text().split("```")[1]
    for path in sorted((REPO / "course_utils").iterdir()):
        if path.name.startswith("__pycache__") or path.suffix not in (".py", ""):
            continue
        assert re.search(rf"\b{path.stem}(\.py|/)", layout), f"{path.name} is not in the layout"


#: A path outside the repository, or a tracker's issue number ("issue 15", "Issue #10"); an
#: upstream issue stays fine when it names its project ("keras-team/keras#20585").
OUTSIDE_REFERENCE = re.compile(r"\.\./shared|(?<![\w/#-])[Ii]ssues? #?\d+\b")
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".txt", ""}


def _tracked_text_files() -> list[pathlib.Path]:
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [REPO / name for name in listed.stdout.splitlines()
            if pathlib.Path(name).suffix in TEXT_SUFFIXES and (REPO / name).is_file()]


def test_the_repository_stands_alone():
    """Nothing points at files outside the repository or at a tracker a reader cannot see."""
    found = []
    for path in _tracked_text_files():
        if path == pathlib.Path(__file__).resolve():
            continue  # this file plants examples of both
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            match = OUTSIDE_REFERENCE.search(line)
            if match:
                found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(("line", "outside"), [
    ("see ../shared/STYLE.md", True), ("Issue 16: four lessons", True),
    ("(issue #15)", True), ("keras-team/keras#20585 is open", False),
    ("tensorflow#48572", False), ("the upstream issue it cites", False)])
def test_outside_references_are_recognised(line, outside):
    assert bool(OUTSIDE_REFERENCE.search(line)) is outside
