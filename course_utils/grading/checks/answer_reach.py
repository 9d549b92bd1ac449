"""Lesson 08's exercises: an answer that reads the check's expected results, or runs the check's
own reference code under its name, is refused before its cases count.

:func:`guarded` scans the learner's code as the framework does, and also the names folded into
its string constants (``getattr(frame, "f_" + "locals")``, ``"__clo" + "sure__"``: an answer
that walked ``inspect.stack()`` to the running ``Case`` and read ``expected`` out of its
``verify`` closure passed exercise 3 before), then wraps it in ``refusals.refusing`` with the
check modules' own functions (``loss_scaling._reference_step`` or
``overflow_rows.outputs_model`` under the answer's name passed before). A name joined at run
time from parts that are not constants still escapes the scan: the bar it is, not a wall.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.framework import refuse_peeks

__all__ = ["guarded", "peeks_refused"]


def peeks_refused(name: str, fn: Any) -> None:
    """Raise an ``AssertionError`` when ``fn``'s code names a frame or closure reader, as a
    name or as a string constant."""
    refuse_peeks(name, fn, constants=True)


def guarded(name: str, fn: Any, modules: Iterable[types.ModuleType], why: str,
            but: Iterable[str] = ()) -> Any:
    """``fn`` scanned (:func:`peeks_refused`), then refusing every function the check
    ``modules`` define while it runs, but those named in ``but`` (what the check hands it,
    such as a loss function made inside one of them)."""
    peeks_refused(name, fn)
    helpers = [helper for module in modules for helper in own_functions(module, but)]
    return refusing(fn, helpers, why)
