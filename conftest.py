"""nbval settings for every notebook the repository's pytest runs collect.

Lax mode executes every cell and compares only cells tagged ``nbval-check-output``; even there,
stderr (TensorFlow's start-up noise) and rich outputs are never compared.
"""

from __future__ import annotations

import os

import pytest

# Quiet TensorFlow's logs in every kernel and subprocess the test run starts (a log filter
# only: TensorFlow's math and runtime keep their defaults).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("MPLBACKEND", "Agg")


#: The longest lessons first (quiet 2-core timings): pytest-xdist (``--dist loadfile``) hands each
#: worker whole notebooks in collection order, so a long one collected last would run alone
#: at the end. The Makefile passes ``--no-loadscope-reorder``, without which pytest-xdist
#: orders files by their number of items instead.
LONGEST_LESSONS_FIRST = ("03_", "09_", "04_", "A_", "07_", "02_", "08_", "01_", "06_", "00_",
                         "05_")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Notebooks: the longest lessons first (a stable sort; test files: tests/conftest.py)."""
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if item.path.suffix != ".ipynb":
            return 0
        return next((index for index, prefix in enumerate(LONGEST_LESSONS_FIRST)
                     if name.startswith(prefix)), len(LONGEST_LESSONS_FIRST))
    items.sort(key=rank)


def pytest_collectstart(collector: pytest.Collector) -> None:
    """nbval: never compare stderr, HTML, JavaScript or widget views."""
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")
