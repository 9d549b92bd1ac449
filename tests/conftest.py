"""Shared set-up of the unit tests: 4 logical CPU devices (nbval settings: ../conftest.py).

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

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests are about CPUs; GPUs are for lessons


def pytest_configure(config: pytest.Config) -> None:
    """Split the CPU into the unit tests' logical devices before any test touches TensorFlow."""
    from course_utils.devices import configure_logical_devices

    configure_logical_devices(UNIT_TEST_LOGICAL_CPUS)



# The order in which pytest-xdist hands out test files: the repository's conftest.py.


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    """The repository root."""
    return REPO


@pytest.fixture
def normal_check_mode(monkeypatch: pytest.MonkeyPatch):
    """Exercise checks in normal (not strict) mode, whatever the environment says."""
    from course_utils.grading import framework

    monkeypatch.delenv(framework.STRICT_ENV, raising=False)
    framework.set_strict(None)
    yield
    framework.set_strict(None)


@pytest.fixture
def assert_not_attempted(capsys: pytest.CaptureFixture[str]):
    """``assert_not_attempted(check, stub)``: the stub is reported "not attempted" in normal mode
    and raises ``NotAttemptedError`` in strict mode."""
    from course_utils.grading import framework

    def verify(check, stub) -> None:
        framework.set_strict(False)
        assert check(stub) is False
        assert "not attempted" in capsys.readouterr().out
        framework.set_strict(True)
        with pytest.raises(framework.NotAttemptedError):
            check(stub)
        framework.set_strict(None)

    return verify


def _learner_diagnosis(timings, whole_step) -> str:
    """Lesson 00's diagnosis as a learner writes it (``statistics``, not the course's code)."""
    import statistics

    import numpy as np

    medians = {name: statistics.median(np.atleast_1d(calls).tolist())
               for name, calls in timings.items()}
    rest = statistics.median(np.atleast_1d(whole_step).tolist()) - sum(medians.values())
    largest = max(medians, key=medians.get)
    return "synchronisation" if rest > medians[largest] else largest


@pytest.fixture
def learner_diagnosis():
    """A right answer to lesson 00's ``diagnose_step`` written without the course's helpers
    (the check refuses its own functions, however they are reached)."""
    return _learner_diagnosis

