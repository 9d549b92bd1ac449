"""A guard for lesson 09's checks: which functions of the course a learner's answer called.

``CallsInto(*targets)`` records, while it is active, every call (from any thread) into a
function whose code lives in one of the target files or is one of the target code objects. It
compares code objects, so a helper bound earlier under another name is caught as surely as the
helper called by its module path, and no module attribute is replaced.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CallsInto"]


class CallsInto:
    """Record every call, made while it is active (any thread), into a function whose code
    lives in one of the ``targets`` files or is one of the ``targets`` code objects: the guard
    compares code objects, so a helper bound earlier under another name (``from
    course_utils.profiling import step_breakdown``) is caught as surely as
    ``cu.profiling.step_breakdown``; no module attribute is replaced."""

    def __init__(self, *targets: Any) -> None:  # files (str) or code objects
        self.files = {t for t in targets if isinstance(t, str)}
        self.codes = {t for t in targets if not isinstance(t, str)}
        self.names: list[str] = []

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and (frame.f_code.co_filename in self.files
                                or frame.f_code in self.codes):
            self.names.append(frame.f_code.co_name)

    def __enter__(self) -> CallsInto:
        import sys
        import threading

        self._previous = sys.getprofile(), threading.getprofile()
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        import sys
        import threading

        sys.setprofile(self._previous[0])
        threading.setprofile(self._previous[1])

    def take(self) -> list[str]:
        names, self.names = list(dict.fromkeys(self.names)), []
        return names
