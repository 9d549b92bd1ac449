"""Exercises and grading: checks for the exercise notebooks, exercise generation, batch grader.

Importing this package is cheap (no TensorFlow): checks import TensorFlow when they run.

* ``cu.grading.check_<exercise>(fn)``: the check cells of the exercise notebooks (``checks``).
* ``run_check``, ``Case``, ``compare``: the small framework the checks are built on.
* ``python -m course_utils exercises [--check]``: exercises from solutions (``generate``).
* ``python -m course_utils grade SUBMISSIONS ...``: the batch grader (``batch``).
* ``python -m course_utils check NOTEBOOK``: grade one notebook and print the result.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading import checks
from course_utils.grading.framework import (
    STRICT_ENV,
    Case,
    NotAttemptedError,
    compare,
    fresh_rng,
    not_attempted,
    run_check,
    set_strict,
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
    "run_check",
    "set_strict",
    "strict_checks",
    "strict_mode",
]


def __getattr__(name: str) -> Any:
    """``cu.grading.check_<exercise>``: every check defined in ``checks``, without a list here."""
    if name.startswith("check_") and callable(getattr(checks, name, None)):
        return getattr(checks, name)
    raise AttributeError(f"module 'course_utils.grading' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *(n for n in vars(checks) if n.startswith("check_"))})
