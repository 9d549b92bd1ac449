"""What the checks' guard (``call_guard``) needs of CPython's threads and of this process's
children, through ``ctypes`` where Python 3.11 has no API for it.

* ``probe()``: the serial number CPython will give the next thread state (it makes one and
  deletes it): the guard compares two readings to count the threads that ran Python between.
* ``watch_others(hook, saved)`` / ``unwatch_others(hook, saved)``: ``hook`` made (and unmade)
  the profiler of every other thread already running, as CPython 3.12's
  ``threading.setprofile_all_threads`` does, on CPython 3.11 only (elsewhere nothing).
* ``children()``: the running children of the calling thread (Linux ``/proc``).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

__all__ = ["children", "probe", "unwatch_others", "watch_others"]


def _api() -> Any:
    """CPython's thread-state functions, through ``ctypes`` (None where they are missing)."""
    try:
        api = ctypes.pythonapi
        api.PyInterpreterState_Get.restype = ctypes.c_void_p
        api.PyThreadState_New.restype = ctypes.c_void_p
        api.PyThreadState_New.argtypes = [ctypes.c_void_p]
        api.PyThreadState_GetID.restype = ctypes.c_uint64
        api.PyThreadState_GetID.argtypes = [ctypes.c_void_p]
        api.PyThreadState_Clear.argtypes = [ctypes.c_void_p]
        api.PyThreadState_Delete.argtypes = [ctypes.c_void_p]
        return (api.PyInterpreterState_Get(), api.PyThreadState_New, api.PyThreadState_GetID,
                api.PyThreadState_Clear, api.PyThreadState_Delete)
    except (AttributeError, OSError):  # not CPython
        return None


_API = _api()


def probe() -> int:
    """The serial number of a thread state made now (and deleted): the next one CPython gives
    out. Every thread that runs Python gets one; -1 where it cannot be read."""
    if _API is None:
        return -1
    interp, new, get_id, clear, delete = _API
    state = new(interp)
    serial = int(get_id(state))
    clear(state)
    delete(state)
    return serial


def _others_api() -> Any:
    """What profiling the threads already running needs (CPython 3.11 only, else None):
    the thread states' list and ``_PyEval_SetProfile``, which CPython 3.12's
    ``threading.setprofile_all_threads`` calls for each thread in the same way."""
    if _API is None or sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return None
    try:
        api = ctypes.pythonapi
        api.PyThreadState_Get.restype = ctypes.c_void_p
        api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
        api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
        api.PyThreadState_Next.restype = ctypes.c_void_p
        api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
        set_profile = api._PyEval_SetProfile
        set_profile.restype = ctypes.c_int
        set_profile.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    except AttributeError:
        return None
    return api, set_profile


_OTHERS = _others_api()
# where a thread state holds its profile function and object (3.11's ``struct _ts``: after
# prev, next, interp, six ints and cframe, come c_profilefunc, c_tracefunc, c_profileobj);
# checked on this thread's own state before any other thread's is touched
_PROFILE_FUNC, _PROFILE_OBJ = 8, 10


def _profile_words(state: int) -> Any:
    return (ctypes.c_void_p * (_PROFILE_OBJ + 1)).from_address(state)


def _other_threads() -> list[int]:
    """The thread states of the interpreter's other threads."""
    api, _ = _OTHERS
    mine = api.PyThreadState_Get()
    states, state = [], api.PyInterpreterState_ThreadHead(_API[0])
    while state:
        if state != mine:
            states.append(state)
        state = api.PyThreadState_Next(state)
    return states


def watch_others(hook: Any, saved: dict[int, Any]) -> None:
    """``hook`` (already this thread's profiler) made every other thread's too: threads that
    were running before the guard started (an executor's workers made earlier). What each
    had is kept in ``saved`` (by thread state) for ``unwatch_others``."""
    if _OTHERS is None:
        return
    api, set_profile = _OTHERS
    words = _profile_words(api.PyThreadState_Get())
    if words[_PROFILE_OBJ] != id(hook):  # not the layout expected: touch nothing
        return
    trampoline = words[_PROFILE_FUNC]
    for state in _other_threads():
        theirs = _profile_words(state)
        if theirs[_PROFILE_OBJ] == id(hook) or state in saved:
            continue
        old = ctypes.cast(theirs[_PROFILE_OBJ], ctypes.py_object).value \
            if theirs[_PROFILE_OBJ] else None  # kept alive here until it is put back
        saved[state] = (theirs[_PROFILE_FUNC], old)
        set_profile(state, trampoline, id(hook))  # it takes its own reference


def unwatch_others(hook: Any, saved: dict[int, Any]) -> None:
    """Each other thread still profiled by ``hook`` gets back what it had."""
    if _OTHERS is None or not saved:
        return
    _, set_profile = _OTHERS
    for state in _other_threads():
        if state in saved and _profile_words(state)[_PROFILE_OBJ] == id(hook):
            function, old = saved[state]
            set_profile(state, function if old is not None else None,
                        id(old) if old is not None else None)
    saved.clear()


def children() -> frozenset[str]:
    """The running children of this thread (Linux ``/proc``; empty elsewhere): a process
    started from C in the watched thread, which raised no event."""
    try:
        with open("/proc/thread-self/children", encoding="ascii") as handle:
            return frozenset(handle.read().split())
    except OSError:
        return frozenset()
