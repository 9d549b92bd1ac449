"""Refusing the course's own answers inside a learner's function (lessons 00, 05, 06, 07).

A check wraps the learner's function in :func:`refusing`: while it runs, the shared guard
(``call_guard.CallsInto``) compares every Python function it enters, in its thread, in the
threads it starts and in the threads already running, with the course's helpers and reference
answers, by identity and by content (an ``exec``'d or line-shifted copy, a paste with renamed
locals); see ``call_guard``. A
learner's function that removes the guard's profiler (``sys.setprofile(None)``, even put back
before it returns), runs Python in a thread the guard cannot watch (``_thread``, even from C;
TensorFlow's threads), starts a process, or changes the guard's record fails too, with a
message naming which.

Content matching catches exact copies only: a copy edited without changing what it computes
(a ``+ 0``, an ``ast``-edited copy) is other bytecode and passes this guard. What makes a
transcribed copy fail is the exercise: each asks for something the course's code does not do
(a task variant), which the check's fresh cases test.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable
from typing import Any

from course_utils.grading.checks.call_guard import (
    FORGED,
    PROCESS,
    RAW_THREAD,
    REMOVED,
    CallsInto,
    code_fingerprint,
)

__all__ = ["code_fingerprint", "own_functions", "refusing"]

_TF_DATA = "tensorflow.python.data."  # where tf.data's dataset classes live
_ADVICE = {  # what went wrong with the watching, and what to do instead
    REMOVED: "the check watches which functions it runs; leave sys.setprofile and "
             "threading.setprofile alone",
    RAW_THREAD: "start threads with threading, and run Python in your function, not in "
                "TensorFlow's threads (where it starts none, an earlier cell's may still run "
                "Python: restart the kernel and run the check again)",
    PROCESS: "compute it in this process",
    FORGED: "leave the check's objects alone",
}

_NOT_THE_COURSES = {  # refused helpers that are TensorFlow's, named as a learner calls them
    "_GradientsHelper": "TensorFlow's tf.gradients (tf.compat.v1.gradients)",
}


def own_functions(module: types.ModuleType, but: Iterable[str] = ()) -> list[Any]:
    """The functions a check module defines (its expected answers among them), to refuse
    while a learner's function runs: none of them is the learner's to call. ``but`` names those
    the learner's function may run (e.g. a dataset's generator the check hands it)."""
    skip = set(but)
    return [value for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__
            and name not in skip]


def _raised_by(fn: Any, error: BaseException) -> bool:
    """True when ``error`` was raised by ``fn``'s own body (the exercise stub)."""
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    code = getattr(fn, "__code__", None)
    return code is None or (last is not None and last.tb_frame.f_code is code)


class _Refusing:
    """``fn``, run so that it fails with ``why`` if it runs (a copy of) one of the helpers.

    Has no ``__code__``, so the framework trusts its NotImplementedError: only the learner's
    own stub raise is let through as one.
    """

    def __init__(self, fn: Any, helpers: Iterable[Any], why: str,
                 also: Callable[[Any, Any], None] | None = None) -> None:
        self.fn, self.why = fn, why
        self.guard = CallsInto(*helpers, also=also)
        self.__wrapped__ = fn  # the framework's introspection guard reads the learner's code

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.guard
        # a tf.data dataset handed to the answer may run the check's generator in
        # TensorFlow's threads when read: thread states are not counted then (call_guard)
        guard.tensorflow_threads = any(type(value).__module__.startswith(_TF_DATA)
                                       for value in (*args, *kwargs.values()))
        try:
            with guard:
                result = self.fn(*args, **kwargs)
                entered = guard.take()  # while it is active: its profiler is checked too
        except NotImplementedError as error:
            if _raised_by(self.fn, error):
                raise
            raise RuntimeError(f"NotImplementedError from inside a library call: {error}"
                               ) from error
        advice = [text for kind, text in _ADVICE.items() if entered[:1] and
                  entered[0].startswith(kind)]
        if advice:
            raise AssertionError(f"{entered[0]}: {advice[0]}")
        if entered:
            whose = _NOT_THE_COURSES.get(entered[0], f"the course's {entered[0]}")
            raise AssertionError(f"your function ran {whose}: {self.why}")
        return result


def refusing(fn: Any, helpers: Iterable[Any], why: str,
             also: Callable[[Any, Any], None] | None = None) -> Any:
    """``fn`` refusing the helpers' code (see the module's docstring); ``also(frame, c_fn)`` is
    called on every call while it runs (``c_fn`` None for Python's). Non-callables pass as
    they are."""
    return _Refusing(fn, helpers, why, also) if callable(fn) else fn
