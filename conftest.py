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


def pytest_collectstart(collector: pytest.Collector) -> None:
    """nbval: never compare stderr, HTML, JavaScript or widget views."""
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")
