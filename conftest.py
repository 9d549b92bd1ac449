"""Settings for every pytest run of the repository: the order of its work, and nbval's.

Lax mode executes every cell and compares only cells tagged ``nbval-check-output``; even there,
stderr (TensorFlow's start-up noise) and rich outputs are never compared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Quiet TensorFlow's logs in every kernel and subprocess the test run starts (a log filter
# only: TensorFlow's math and runtime keep their defaults).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")


#: The longest work first, test files and notebooks together (their seconds in a 2-core run,
#: longest first): pytest-xdist (``--dist loadfile``) hands each worker whole files and whole
#: notebooks in collection order, so a long one collected last would run alone at the end. The
#: Makefile passes ``--no-loadscope-reorder``, without which pytest-xdist orders them by their
#: number of items instead. A name ending in ``_`` is a lesson's prefix (its notebooks).
LONGEST_FIRST = (
    "test_grading_nbgrader.py", "test_checks_lesson_02.py", "09_", "03_",
    "test_checks_lesson_07.py", "test_gradescope.py", "A_", "test_grading_grader.py", "04_",
    "test_checks_lesson_08.py", "test_training.py", "test_cluster.py", "02_", "07_",
    "test_checks_lesson_03.py", "test_checks_lesson_09.py", "01_", "test_checks_lesson_05.py",
    "08_", "test_dependencies.py", "test_checks_lesson_00.py", "test_devices.py",
    "test_grading_scaffold.py", "test_checks_lesson_06.py", "test_cluster_process.py",
    "test_works_where.py", "test_checks_lesson_04.py", "06_", "test_strategies.py", "00_",
    "test_checks_lesson_01.py", "test_data.py", "test_memory_and_accumulation_plot.py", "05_")


def pytest_configure(config: pytest.Config) -> None:
    """pytest's main process starts pip's dry runs of ``tests/test_dependencies.py`` at once
    (``tests/tools/dry_runs.py``), when the run will hold them: they wait on the registry, not
    on a worker."""
    if os.environ.get("PYTEST_XDIST_WORKER") or "not slow" in (config.option.markexpr or ""):
        return
    here = Path(__file__).resolve().parent
    wanted = here / "tests" / "test_dependencies.py"
    given = [Path(str(arg).split("::")[0]).resolve() for arg in config.args]
    if not any(path == wanted or path in wanted.parents for path in given):
        return
    import sys
    import tempfile

    sys.path.insert(0, str(here / "tests" / "tools"))
    import dry_runs

    folder = Path(tempfile.mkdtemp(prefix="course-dry-runs-"))
    config.add_cleanup(dry_runs.start(folder).kill)
    os.environ["COURSE_DRY_RUNS"] = str(folder)  # dry_runs.FOLDER_ENV, for the workers
    config.add_cleanup(lambda: os.environ.pop("COURSE_DRY_RUNS", None))


def _rank(path: Path) -> int:
    """Where a file or notebook comes in ``LONGEST_FIRST`` (after all of them when absent)."""
    name = path.name
    return next((index for index, entry in enumerate(LONGEST_FIRST)
                 if name == entry or (entry.endswith("_") and path.suffix == ".ipynb"
                                      and name.startswith(entry))), len(LONGEST_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files and notebooks first (a stable sort: every other order is kept)."""
    items.sort(key=lambda item: _rank(item.path))


#: The GPUs the run was started with (JSON; ``null``: the variable was unset), kept in the
#: environment so that pytest-xdist's workers inherit them too: the unit tests hide the GPUs from
#: their own processes (``tests/conftest.py``, imported after this file), but a lesson's kernel
#: gets them back, so that ``make test`` on a GPU machine runs the lessons on its GPUs, as a
#: learner's kernel does.
_RUN_GPUS = "COURSE_TEST_RUN_GPUS"
os.environ.setdefault(_RUN_GPUS, json.dumps(os.environ.get("CUDA_VISIBLE_DEVICES")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """A notebook's kernel (started when its first cell is set up) sees the run's own GPUs."""
    if item.path.suffix != ".ipynb":
        yield
        return
    hidden = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    gpus = json.loads(os.environ[_RUN_GPUS])
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    try:
        yield
    finally:  # hidden again for the unit tests that follow in this process
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        if hidden is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden


def pytest_collectstart(collector: pytest.Collector) -> None:
    """nbval: never compare stderr, HTML, JavaScript or widget views."""
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")
