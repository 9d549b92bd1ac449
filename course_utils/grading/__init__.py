"""Exercises and grading: checks for the exercise notebooks, exercise generation, batch grader.

Importing this package is cheap (no TensorFlow): checks import TensorFlow when they run.

* ``cu.grading.check_<exercise>(fn)``: the check cells of the exercise notebooks; each lesson's
  checks live in ``checks/lesson_NN.py`` and register themselves by name.
* ``cu.grading.require_passed("check_<exercise>")``: the hidden test of a check cell, which
  fails an unsolved exercise when nbgrader (or our grader) grades it.
* ``run_check``, ``Case``, ``compare``: the small framework the checks are built on.
* ``python -m course_utils exercises [--check]``: exercises from solutions (``generate``).
* ``python -m course_utils grade SUBMISSIONS ...``: the batch grader (``batch``).
* ``python -m course_utils check NOTEBOOK``: grade one notebook and print the result.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading import checks
from course_utils.grading.checks.registry import require_passed
from course_utils.grading.framework import (
    STRICT_ENV,
    Case,
    NotAttemptedError,
    compare,
    fresh_rng,
    not_attempted,
    run_check,
    set_strict,
    stderr_to_stdout,
    strict_checks,
    strict_mode,
)

__all__ = [
    "STRICT_ENV",
    "Case",
    "NotAttemptedError",
    "checks",
    "compare",
    "fresh_rng",
    "not_attempted",
    "require_passed",
    "run_check",
    "set_strict",
    "stderr_to_stdout",
    "strict_checks",
    "strict_mode",
]


def __getattr__(name: str) -> Any:
    """``cu.grading.check_<exercise>``: every registered check, without a list here."""
    fn = checks.registry.get(name)
    if fn is None:
        raise AttributeError(f"module 'course_utils.grading' has no attribute {name!r}")
    return fn


def __dir__() -> list[str]:
    return sorted({*globals(), *checks.registry.names()})
