"""Python's, NumPy's, TensorFlow's and Keras's own functions, as a check computes with them.

A check judges with the libraries it shares with the answer: ``max``, ``numpy.isclose``,
``tf.clip_by_global_norm``, ``tf.train.latest_checkpoint``. An answer that rebinds one (in an
earlier cell or while it runs) rigs the verdict without touching the course's code, which
``code_watch`` watches. :func:`bindings` takes the functions these namespaces bind;
:func:`replaced` names those bound since to other objects, and those bound at any time to the
learner's own code (a notebook cell: what an earlier cell did). Names added are not changes.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from course_utils.grading.frame_reach import learners_file, learners_hooks

__all__ = ["bindings", "refuse_reached", "replaced"]

#: The namespaces watched, where loaded: the built-ins and the API modules checks compute with.
NAMESPACES = ("builtins", "math", "operator", "numpy", "numpy.linalg", "tensorflow",
              "tensorflow.math", "tensorflow.nn", "tensorflow.train", "tensorflow.io",
              "tensorflow.data", "tensorflow.distribute", "tensorflow.linalg",
              "tensorflow.random", "tensorflow.config", "keras", "keras.ops")


def _namespaces() -> dict[str, Any]:
    found = {}
    for name in NAMESPACES:
        top, _, rest = name.partition(".")
        module = sys.modules.get(top)
        for part in rest.split(".") if rest else ():
            module = getattr(module, part, None) if module is not None else None
        if isinstance(module, types.ModuleType):
            found[name] = module
    return found


def _callable_kinds() -> tuple[type, ...]:
    kinds: list[type] = [types.FunctionType, types.BuiltinFunctionType]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kinds.append(numpy.ufunc)
    return tuple(kinds)


def bindings() -> dict[tuple[str, str], int]:
    """``(namespace, name) -> id`` of every function a watched namespace binds now."""
    kinds = _callable_kinds()
    return {(space, name): id(value) for space, module in _namespaces().items()
            for name, value in list(vars(module).items())
            if not name.startswith("_") and isinstance(value, kinds)}


def replaced(before: dict[tuple[str, str], int]) -> list[str]:
    """What was rebound since ``before`` was taken, and what is bound to the learner's code."""
    found = []
    for space, module in _namespaces().items():
        for name, value in list(vars(module).items()):
            if name.startswith("_") or not callable(value):
                continue
            code = getattr(value, "__code__", None)
            if isinstance(code, types.CodeType) and learners_file(code.co_filename):
                found.append(f"{space}.{name}")
            elif before.get((space, name), id(value)) != id(value):
                found.append(f"{space}.{name}")
    return found


def refuse_reached(name: str, number: int, reached: list[str],
                   libraries: dict[tuple[str, str], int]) -> None:
    """An ``AssertionError`` naming how the learner's code reached the interpreter's frames
    while the check ran (``frame_reach``), if it did, or could: a hook of theirs; or a
    library function the check computes with that it replaced (``library_watch``)."""
    rebound = replaced(libraries)
    if rebound:
        more = f" and {len(rebound) - 4} more" if len(rebound) > 4 else ""
        raise AssertionError(
            f"{name}: case {number}: {', '.join(rebound[:4])}{more} is not the library's own "
            "function (your code replaced it, in an earlier cell or while the check ran): the "
            "check computes with it. Restart the kernel and run the notebook without that.")
    hooks = learners_hooks()
    if reached or hooks:
        how = ", ".join(dict.fromkeys(reached)) if reached else (
            f"{', '.join(hooks)} of yours is set: it is handed the interrupted frames")
        raise AssertionError(
            f"{name}: case {number}: your code read the interpreter's frames while the check "
            f"ran ({how}): the check's frames hold what it compares with. Compute the answer "
            "from the arguments.")
