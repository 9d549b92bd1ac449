"""Shared pytest set-up: 4 logical CPU devices for unit tests, and nbval configuration.

Logical devices are fixed once TensorFlow creates its devices, so they are configured here,
before any test runs: every unit test sees /device:CPU:0 to /device:CPU:3. A test that needs
another layout runs it in a subprocess.
"""

from __future__ import annotations

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
UNIT_TEST_LOGICAL_CPUS = 4

# Quiet TensorFlow in this process and in every kernel or subprocess it starts.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests are about CPUs; GPUs are for lessons
os.environ.setdefault("MPLBACKEND", "Agg")


def _runs_unit_tests(config: pytest.Config) -> bool:
    """False for a pure nbval run (only notebooks named): no need to import TensorFlow then."""
    args = [str(a) for a in config.args]
    return not args or any(not a.endswith(".ipynb") and "notebooks" not in a
                           and "solutions" not in a and "exercises" not in a for a in args)


def pytest_configure(config: pytest.Config) -> None:
    if _runs_unit_tests(config):
        from course_utils.devices import configure_logical_devices

        configure_logical_devices(UNIT_TEST_LOGICAL_CPUS)


def pytest_collectstart(collector: pytest.Collector) -> None:
    """nbval: never compare stderr (TensorFlow writes start-up noise there) or rich outputs."""
    path = getattr(collector, "path", None)
    if path is not None and path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    """The repository root."""
    return REPO
