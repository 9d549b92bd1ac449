"""The course's code kept as it was while a learner's function runs inside a check.

An answer runs in the same Python process as the check that judges it, so it could replace a
judge while it runs: ``import course_utils.grading.checks.worker_passes as wp;
wp.fresh_passes_message = lambda *a, **k: None`` inside the learner's function passes any
dataset, and the grader's fresh import of ``course_utils.grading`` before each check cell cannot
help, because the replacement happens during the check. :func:`course_code_kept` records every
function, class and constant of the loaded ``course_utils`` modules (the module's name bound to
them, a function's code and defaults, a class's own names and methods; a number, string or
tuple a module binds, such as a threshold) before the learner's code runs; after it,
whatever was rebound, recoded or deleted is put back and the check fails, naming it. Names added
are not changes (the course imports lazily). What lies outside ``course_utils`` (NumPy,
TensorFlow, Python's built-ins) is not watched: patching Python itself is never protected.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["course_code_kept"]

_KINDS = (types.FunctionType, type, types.ModuleType)
#: Constants watched too (a threshold raised passes anything), compared by value.
_VALUES = (int, float, complex, str, bytes, bool, type(None))
MEMBERS = "(its members)"  # the part that holds the names a class of the course defines


def _function_parts(fn: types.FunctionType) -> tuple[Any, ...]:
    return fn.__code__, fn.__defaults__, fn.__kwdefaults__


def _snapshot() -> dict[tuple[str, str, str], Any]:
    """``(module, name, part) -> object`` for every function, class and constant bound in a
    loaded ``course_utils`` module: the binding, a function's code and defaults, and a class's
    own names and the functions it defines itself (where it is defined)."""
    kept: dict[tuple[str, str, str], Any] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "course_utils"
                                  or module_name.startswith("course_utils.")):
            continue
        for name, value in list(vars(module).items()):
            if type(value) in _VALUES or isinstance(value, (tuple, frozenset)):
                kept[module_name, name, ""] = value
                continue
            if not isinstance(value, _KINDS):
                continue
            kept[module_name, name, ""] = value
            if getattr(value, "__module__", None) != module_name:
                continue  # imported: watched where it is defined
            if isinstance(value, types.FunctionType):
                kept[module_name, name, "code"] = _function_parts(value)
            elif isinstance(value, type):
                members = vars(value)
                kept[module_name, name, MEMBERS] = frozenset(members)
                for attribute, member in list(members.items()):
                    if isinstance(member, types.FunctionType):
                        kept[module_name, name, attribute] = (member, *_function_parts(member))
    return kept


def _same(now: Any, then: Any) -> bool:
    """The same objects (tuples compared item by item, by identity: no ``__eq__`` runs)."""
    if isinstance(then, frozenset) and isinstance(now, frozenset):  # a class's names (str)
        return now == then
    if type(then) in _VALUES:
        return type(now) is type(then) and (now == then or now != now and then != then)
    if isinstance(then, tuple) and isinstance(now, tuple):
        return len(now) == len(then) and all(a is b for a, b in zip(now, then, strict=True))
    return now is then


def _put_back(changed: list[tuple[str, str, str]], kept: dict[tuple[str, str, str], Any],
              modules: dict[str, Any]) -> None:
    """Restore every changed binding, code, defaults and method of ``kept``."""
    for module_name, name, part in changed:
        module, original = modules[module_name], kept[module_name, name, ""]
        if part == "":
            setattr(module, name, original)
        elif part == MEMBERS:
            for added in set(vars(original)) - kept[module_name, name, part]:
                delattr(original, added)
        elif part == "code":
            original.__code__, original.__defaults__, original.__kwdefaults__ = (
                kept[module_name, name, part])
        else:
            member, code, defaults, kwdefaults = kept[module_name, name, part]
            member.__code__, member.__defaults__, member.__kwdefaults__ = (
                code, defaults, kwdefaults)
            setattr(original, part, member)


@contextlib.contextmanager
def course_code_kept(check: str) -> Iterator[None]:
    """Run the block (the learner's code inside check ``check``); afterwards, put back any
    function or class of the course it replaced and fail, naming what it replaced."""
    snapshot, put_back, same = _snapshot, _put_back, _same  # bound now: the block may rebind
    kept = snapshot()
    modules = {module_name: sys.modules[module_name] for module_name, _, _ in kept}
    finished = False
    try:
        yield
        finished = True
    finally:
        now = snapshot()
        changed = sorted(key for key, value in kept.items()
                         if key not in now or not same(now[key], value))
        if changed:
            put_back(changed, kept, modules)
            rebound = {(m, n) for m, n, p in changed if p == ""}
            named = [f"{m}.{n}" + ("" if p == "" else f" {p}" if p == MEMBERS
                                   else " (its code)" if p == "code" else f".{p}")
                     for m, n, p in changed if p == "" or (m, n) not in rebound]
            names = ", ".join(named[:4])
            more = f" and {len(named) - 4} more" if len(named) > 4 else ""
            raise AssertionError(
                f"{check}: your code replaced the course's own {names}{more} while the check "
                "ran (put back now). Compute the answer; do not change the code that judges it."
                + (" Any ✅ line above does not count." if finished else ""))
