"""The table of checks by name, and what each check last said in this kernel.

Each lesson's module registers its checks with ``@register``; a check is registered under its
function name (``check_<exercise>``) and the notebooks reach it as
``cu.grading.check_<exercise>(fn)``. Two checks with one name are an error, found at import
time: a lesson author who copies a check and forgets to rename it learns it at once.

A registered check runs with stderr kept clean (see ``framework.stderr_to_stdout``) and its
result is remembered, so that a check cell's hidden test (nbgrader's ``### BEGIN HIDDEN
TESTS``, removed from the learner's copy and put back when grading) can fail an exercise that
was not attempted: ``cu.grading.require_passed("check_<exercise>")``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from course_utils.grading.checks.call_guard import searches
from course_utils.grading.code_watch import course_code_kept, replaced_before
from course_utils.grading.framework import NotAttemptedError, stderr_to_stdout

__all__ = ["DuplicateCheckError", "get", "names", "register", "require_passed"]

Check = TypeVar("Check", bound=Callable[..., Any])

_CHECKS: dict[str, Callable[..., Any]] = {}
_RESULTS: dict[str, Any] = {}  # the value each check returned last: True passed, False stub


class DuplicateCheckError(ValueError):
    """Raised when a second check claims a name that another module already registered."""


def _origin(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def register(fn: Check) -> Check:
    """Decorator: register ``fn`` under its name (``check_...``); it runs with stderr clean."""
    name = fn.__name__
    if not name.startswith("check_"):
        raise ValueError(f"a check's name starts with 'check_', got {name!r}")
    known = _CHECKS.get(name)
    if known is fn:  # registered already
        return fn
    if known is not None and _origin(known) != _origin(fn):  # a module reloaded is no duplicate
        raise DuplicateCheckError(f"check {name!r} is registered twice: by {_origin(known)} "
                                  f"and by {_origin(fn)}; rename one of them")

    @functools.wraps(fn)
    def check(*args: Any, **kwargs: Any) -> Any:
        _RESULTS.pop(name, None)
        replaced = replaced_before()
        if replaced:
            more = f" and {len(replaced) - 4} more" if len(replaced) > 4 else ""
            raise AssertionError(
                f"{name.removeprefix('check_')}: the course's own {', '.join(replaced[:4])}"
                f"{more} {'differ' if len(replaced) > 1 else 'differs'} from its source: an "
                "earlier cell replaced it, and the check cannot judge with it. Restart the "
                "kernel and run the notebook without that change.")
        searched, _ = searches()
        with stderr_to_stdout(), course_code_kept(name.removeprefix("check_")):
            result = fn(*args, **kwargs)
        now, intact = searches()
        if now != searched or not intact:  # the cases, verdicts and logs are all in there
            raise AssertionError(
                f"{name.removeprefix('check_')}: your function searched the garbage collector's "
                "objects while the check ran (or rewrote the check's log): the cases and "
                "verdicts are in there. Compute the answer; do not reach into the check. Any "
                "✅ line above does not count.")
        _RESULTS[name] = result
        return result

    _CHECKS[name] = check
    return check  # type: ignore[return-value]


def get(name: str) -> Callable[..., Any] | None:
    """The check registered under ``name``, or ``None``."""
    return _CHECKS.get(name)


def names() -> list[str]:
    """Every registered check's name, sorted."""
    return sorted(_CHECKS)


def require_passed(name: str) -> None:
    """Raise unless check ``name`` ran in this kernel and passed (the hidden test of a check cell).

    An exercise that still holds its stub raises :class:`NotAttemptedError`, so nbgrader scores
    the cell 0 while the learner's copy (without the hidden test) runs on.
    """
    if name not in _CHECKS:
        raise KeyError(f"no check called {name!r}")
    if name not in _RESULTS:
        raise AssertionError(f"{name} has not run: call cu.grading.{name}(...) first")
    if _RESULTS[name] is not True:
        raise NotAttemptedError(f"{name.removeprefix('check_')}: not attempted yet")
