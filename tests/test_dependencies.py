"""The course installs beside Colab's stack without changing it (pip's resolver says so)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import sys

import pytest
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "tools"))
import dry_runs as dry_runs_module  # noqa: E402

COLAB_STACK = dry_runs_module.COLAB_STACK
#: Installed on Colab by nobody, so the course must never bring them.
FORBIDDEN = ("jupyterlab", "jupyterlab-server")


def colab_pins() -> dict[str, str]:
    """Colab's packages and versions, from requirements/colab.txt."""
    pins = {}
    for line in COLAB_STACK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> pathlib.Path:
    """The folder of both resolver runs (``dry_runs.py``): started by pytest's main process as
    the run began, or here when it did not."""
    started = os.environ.get(dry_runs_module.FOLDER_ENV)
    folder = pathlib.Path(started) if started else tmp_path_factory.mktemp("dry-runs")
    runner = None if started else dry_runs_module.start(folder)
    code = int(dry_runs_module.read(folder, "index.rc"))
    if code != 0 or colab_pins()["keras"] not in dry_runs_module.read(folder, "index.out"):
        pytest.skip("the package registry is unreachable: pip's resolver cannot run")
    yield folder
    if runner is not None:
        runner.kill()
        runner.wait()


def _resolved(folder: pathlib.Path, name: str) -> dict[str, str]:
    """What pip would install for the dry run ``name``: package -> version."""
    code = int(dry_runs_module.read(folder, f"{name}.rc"))
    assert code == 0, (folder / f"{name}.err").read_text()[-3000:]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads((folder / f"{name}.json").read_text())["install"]}


@pytest.mark.slow
def test_pip_installs_the_course_beside_colabs_stack_without_changing_it(dry_runs):
    """pip's resolver, asked for the course together with Colab's exact versions, keeps them all.

    Colab's packages are given as exact requirements beside the course (``--ignore-installed``:
    nothing of this machine counts). A solution then exists only if every range of the course
    admits Colab's version; had one excluded it, pip would stop with ResolutionImpossible, while
    on Colab it would replace the runtime's package. What the pins cannot show, pip preferring a
    newer release of a package Colab lacks that needs a newer Colab package, ``make
    test-colab-stack`` shows: it installs the course unconstrained into an environment that holds
    Colab's stack and checks that nothing moved (test_this_environment_is_colabs_stack).
    """
    installs = _resolved(dry_runs, "colab")
    assert installs.pop("scaling-tensorflow-course") == "0.1.0"
    colab = colab_pins()
    assert {name: installs.get(name) for name in colab} == colab
    assert not set(FORBIDDEN) & set(installs), "the course must not bring JupyterLab to Colab"
    others = len(set(installs) - set(colab))
    print(f"Colab's {len(colab)} packages kept; {others} more resolved (their dependencies)")


@pytest.mark.slow
def test_the_lock_pins_every_package_the_course_environment_needs(dry_runs):
    """Resolving the course with all extras under the lock installs exactly the lock's pins."""
    installs = _resolved(dry_runs, "lock")
    installs.pop("scaling-tensorflow-course")
    lock = {}
    for line in (REPO / "requirements" / "lock.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            lock[canonicalize_name(name)] = version.strip()
    assert installs == lock


def test_this_environment_is_colabs_stack():
    """In .venv-colab (make test-colab-stack): Colab's versions survived the course's install."""
    if not os.environ.get("COURSE_COLAB_STACK"):
        pytest.skip("only in the Colab-stack environment (make test-colab-stack)")
    installed = {name: importlib.metadata.version(name) for name in colab_pins()}
    assert installed == colab_pins()
    assert importlib.metadata.version("scaling-tensorflow-course") == "0.1.0"
    for name in FORBIDDEN:
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(name)


def test_colab_pins_read_the_stack_file():
    pins = colab_pins()
    assert pins["tensorflow"] == "2.20.0" and pins["ipywidgets"] == "7.7.1"
    assert all(name == canonicalize_name(name) for name in pins)
