"""The exercise checks: one module per lesson (``lesson_NN.py``), found here without a list.

Every ``lesson_*.py`` in this folder is imported when the package is, and registers its checks
with :func:`~course_utils.grading.checks.registry.register`. A new lesson adds its own module;
it edits nothing here. A check is reached by name, ``checks.check_<exercise>`` or
``cu.grading.check_<exercise>``. Lesson modules import TensorFlow inside their checks, never at
module level, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from course_utils.grading.checks import registry
from course_utils.grading.checks.registry import DuplicateCheckError, register

LESSON_PREFIX = "lesson_"


def lesson_module_names() -> list[str]:
    """The lesson modules of this package (``lesson_00``, ``lesson_01``, ...), sorted."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if info.name.startswith(LESSON_PREFIX))


def load_lessons() -> list[str]:
    """Import every lesson module (each registers its checks); return their names."""
    found = lesson_module_names()
    for name in found:
        importlib.import_module(f"{__name__}.{name}")
    return found


def check(name: str) -> Callable[..., Any]:
    """The check called ``name`` (``check_<exercise>``); ``KeyError`` names the known ones."""
    fn = registry.get(name)
    if fn is None:
        raise KeyError(f"no check called {name!r}; known: {', '.join(registry.names())}")
    return fn


load_lessons()

# The lesson modules are public too (a notebook may read a lesson's constants, e.g. the
# diagnoses of lesson 02), found like the checks: no list to edit.
__all__ = ["LESSON_PREFIX", "DuplicateCheckError", "check", "lesson_module_names",
           "load_lessons", "register", "registry", "worker_scripts", *lesson_module_names(),
           *registry.names()]


def __getattr__(name: str) -> Any:
    """``checks.check_<exercise>``: every registered check, without a list here."""
    fn = registry.get(name)
    if fn is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return fn


def __dir__() -> list[str]:
    return sorted({*globals(), *registry.names()})
