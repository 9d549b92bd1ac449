"""The course installs beside Colab's stack without changing it (pip's resolver says so)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]
COLAB_STACK = REPO / "requirements" / "colab.txt"
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


def _registry_reachable(pip: list[str]) -> bool:
    """True when pip's index answers and knows Colab's Keras (so the resolver can run)."""
    try:
        result = subprocess.run([*pip, "index", "versions", "keras"], capture_output=True,
                                text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and colab_pins()["keras"] in result.stdout


#: The two questions for pip's resolver (``pip install --dry-run --report``): the course beside
#: Colab's exact versions; the course with all extras under the lock.
DRY_RUNS = {
    "colab": [str(REPO), "-r", str(COLAB_STACK)],
    "lock": ["-c", str(REPO / "requirements" / "lock.txt"), f"{REPO}[lab,grading,dev,book]"],
}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[subprocess.Popen, pathlib.Path]]:
    """Both resolver runs, started at once (each mostly waits on the registry: together they
    take the time of one)."""
    pip = [sys.executable, "-m", "pip"]
    if not _registry_reachable(pip):
        pytest.skip("the package registry is unreachable: pip's resolver cannot run")
    folder = tmp_path_factory.mktemp("dry-runs")
    started = {}
    for name, args in DRY_RUNS.items():
        report = folder / f"{name}.json"
        started[name] = (subprocess.Popen(
            [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
             str(report), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            report)
    yield started
    for process, _ in started.values():
        process.kill()
        process.communicate()


def _resolved(dry_runs: dict, name: str) -> dict[str, str]:
    """What pip would install for the dry run ``name``: package -> version."""
    process, report = dry_runs[name]
    _, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


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
