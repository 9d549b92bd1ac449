"""Lesson 08's exercises: an answer that reads the check's expected results, or runs the check's
own reference code under its name, is refused before its cases count.

:func:`guarded` scans the learner's code as the framework does, and also the names folded into
its string constants (``getattr(frame, "f_" + "locals")``, ``"__clo" + "sure__"``: an answer
that walked ``inspect.stack()`` to the running ``Case`` and read ``expected`` out of its
``verify`` closure passed exercise 3 before), then wraps it in ``refusals.refusing`` with the
check modules' own functions (``loss_scaling._reference_step`` or
``overflow_rows.outputs_model`` under the answer's name passed before). A name joined at run
time from parts that are not constants still escapes the scan: the bar it is, not a wall.

:func:`plain_number` and :func:`weights_of` read what an answer hands back, or the model it
was handed, without running the learner's code: a ``float`` subclass whose ``__float__``, an
object whose ``__index__``, or a ``get_weights`` set on the model instance ran inside the
check, after its expected values existed, and passed lessons 05 and 08 before.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from course_utils.grading.checks.refusals import own_functions, refusing
from course_utils.grading.framework import refuse_peeks

__all__ = ["guarded", "peeks_refused", "plain_number", "weights_of"]


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


def plain_number(value: Any) -> int | float | bool | None:
    """``value`` as Python's own number when its type is exactly Python's ``int``, ``float``
    or ``bool``, a NumPy number (a 0-d array too) or a TensorFlow eager scalar; else None.
    Exact types only: a subclass's conversion would run the learner's code in the check."""
    kind = type(value)
    if kind in (int, float, bool):
        return value
    tf = sys.modules.get("tensorflow")
    if tf is not None and kind is type(tf.constant(0)):
        value, kind = value.numpy(), np.ndarray
    if kind is np.ndarray and value.shape == () or (
            kind.__module__ == "numpy" and isinstance(value, np.generic)):
        return value.item() if value.dtype.kind in "biuf" else None
    return None


def weights_of(model: Any) -> list[np.ndarray]:
    """The model's weights read from its variables, as ``keras.Layer.get_weights`` does, never
    through a ``get_weights`` the learner set on this model (refused, ``AssertionError``)."""
    shadows = [name for name in ("get_weights", "set_weights") if name in vars(model)]
    if shadows:
        raise AssertionError(
            f"your function set {shadows[0]} on the model itself, hiding Keras's method: the "
            "check reads the weights from the model's variables. Leave the model's methods "
            "as they are")
    return [np.array(v.numpy()) for v in model.weights]
