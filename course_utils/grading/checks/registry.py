"""The table of checks by name: each lesson's module registers its checks with ``@register``.

A check is registered under its function name (``check_<exercise>``); the notebooks reach it
as ``cu.grading.check_<exercise>(fn)``. Two checks with one name are an error, found at import
time: a lesson author who copies a check and forgets to rename it learns it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DuplicateCheckError", "get", "names", "register"]

Check = TypeVar("Check", bound=Callable[..., Any])

_CHECKS: dict[str, Callable[..., Any]] = {}


class DuplicateCheckError(ValueError):
    """Raised when a second check claims a name that another module already registered."""


def _origin(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def register(fn: Check) -> Check:
    """Decorator: register ``fn`` under its name, which must start with ``check_``."""
    name = fn.__name__
    if not name.startswith("check_"):
        raise ValueError(f"a check's name starts with 'check_', got {name!r}")
    known = _CHECKS.get(name)
    if known is not None and _origin(known) != _origin(fn):  # a module reloaded is no duplicate
        raise DuplicateCheckError(f"check {name!r} is registered twice: by {_origin(known)} "
                                  f"and by {_origin(fn)}; rename one of them")
    _CHECKS[name] = fn
    return fn


def get(name: str) -> Callable[..., Any] | None:
    """The check registered under ``name``, or ``None``."""
    return _CHECKS.get(name)


def names() -> list[str]:
    """Every registered check's name, sorted."""
    return sorted(_CHECKS)
