"""What the checks' guard (``call_guard``) needs of CPython's threads and of this process's
children, through ``ctypes`` where Python 3.11 has no API for it.

* ``probe()``: the serial number CPython will give the next thread state (it makes one and
  deletes it): the guard compares two readings to count the threads that ran Python between.
* ``watch_others(hook, saved)`` / ``unwatch_others(hook, saved)``: ``hook`` made (and unmade)
  the profiler of every other thread already running, as CPython 3.12's
  ``threading.setprofile_all_threads`` does, on CPython 3.11 only (elsewhere nothing). CPython
  3.11 lets one profiler install run at a time in the whole process and refuses another
  begun meanwhile ("Cannot install a profile function while another profile function is
  being installed"; an install runs the audit hooks, whose Python may let other threads run):
  a thread still starting (in ``threading``'s start-up, before its ``run``) is left alone, as
  it installs ``threading``'s profiler itself, and each install waits until no other thread is
  in the middle of one. Not prevented: a thread whose start-up install begins while another
  install runs the audit hooks is refused, and dies before its ``run`` (seen once: a replica
  thread of ``MirroredStrategy``, on which the check then waited).
* ``install(profile)``: ``sys.setprofile(profile)`` for this thread, once no other thread is in
  the middle of an install (below).
* ``children()``: the running children of the calling thread (Linux ``/proc``).
"""

from __future__ import annotations

import ctypes
import dis
import sys
import threading
import time
from typing import Any

__all__ = ["INSTALLERS", "children", "install", "probe", "unwatch_others", "watch_others"]


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


def _thread_id_word() -> int | None:
    """Where a thread state holds its thread's ident (3.11's ``thread_id``), found in this
    thread's own state (None where it is not found exactly once)."""
    if _OTHERS is None:
        return None
    words = (ctypes.c_ulong * 48).from_address(_OTHERS[0].PyThreadState_Get())
    found = [i for i in range(48) if words[i] == threading.get_ident()]
    return found[0] if len(found) == 1 else None


def _run_line() -> int | None:
    """The line of ``self.run()`` in ``threading.Thread._bootstrap_inner``."""
    code = threading.Thread._bootstrap_inner.__code__
    lines = [i.positions.lineno for i in dis.get_instructions(code)
             if i.argval == "run" and i.positions is not None]
    return min(lines) if lines else None


_THREAD_ID, _RUN = _thread_id_word(), _run_line()
_STARTING = (threading.Thread._bootstrap.__code__, threading.Thread._bootstrap_inner.__code__)


def _starting(state: int, frames: dict[int, Any]) -> bool:
    """Whether the thread of ``state`` is in ``threading``'s start-up, before its ``run``."""
    if _THREAD_ID is None or _RUN is None:
        return False
    frame = frames.get((ctypes.c_ulong * (_THREAD_ID + 1)).from_address(state)[_THREAD_ID])
    while frame is not None:
        if frame.f_code is _STARTING[1]:
            return frame.f_lineno < _RUN
        if frame.f_code is _STARTING[0]:  # in _bootstrap, not yet in _bootstrap_inner
            return True
        frame = frame.f_back
    return False


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
    frames = sys._current_frames()  # where each thread is: one still starting is left alone
    for state in _other_threads():
        theirs = _profile_words(state)
        if theirs[_PROFILE_OBJ] == id(hook) or state in saved or _starting(state, frames):
            continue
        old = ctypes.cast(theirs[_PROFILE_OBJ], ctypes.py_object).value \
            if theirs[_PROFILE_OBJ] else None  # kept alive here until it is put back
        saved[state] = (theirs[_PROFILE_FUNC], old)
        _set(set_profile, state, trampoline, id(hook))  # it takes its own reference


def unwatch_others(hook: Any, saved: dict[int, Any]) -> None:
    """Each other thread still profiled by ``hook`` gets back what it had."""
    if _OTHERS is None or not saved:
        return
    _, set_profile = _OTHERS
    for state in _other_threads():
        if state in saved and _profile_words(state)[_PROFILE_OBJ] == id(hook):
            function, old = saved[state]
            _set(set_profile, state, function if old is not None else None,
                 id(old) if old is not None else None)
    saved.clear()


def _set(set_profile: Any, *arguments: Any) -> None:
    """``_PyEval_SetProfile``, once no other thread is in the middle of an install: CPython
    3.11 lets one install run at a time in the whole process (its audit hooks may let other
    threads run) and refuses a second, setting the error on the thread whose profiler was to
    change (a thread of TensorFlow's then failed with SystemError)."""
    _wait_for_installs()
    set_profile(*arguments)


def install(profile: Any) -> None:
    """``sys.setprofile(profile)``, once no other thread is in the middle of an install (and
    again after a pause where one began meanwhile: the error is then this thread's)."""
    for pause in (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
        _wait_for_installs()
        try:
            sys.setprofile(profile)
            return
        except RuntimeError as error:
            if "being installed" not in str(error):
                raise
            time.sleep(pause)
    sys.setprofile(profile)


def _wait_for_installs() -> None:
    for _ in range(2000):  # at most about a second: an install takes microseconds
        if not _installing(sys._current_frames()):
            return
        time.sleep(0.0005)  # this thread lets the other finish


def _installing(frames: dict[int, Any]) -> bool:
    """Whether another thread is in the middle of a profiler install: running an audit hook
    (``hook(event, args)``) for the event ``sys.setprofile``, which let this thread run."""
    mine = threading.get_ident()
    for ident, frame in frames.items():
        while ident != mine and frame is not None:
            if frame.f_code.co_varnames[:2] == ("event", "args") and frame.f_locals.get(
                    "event") == "sys.setprofile":
                return True
            frame = frame.f_back
    return False


# what installs a profiler for the guard (its audit hook knows its own installs by these)
INSTALLERS = (watch_others.__code__, unwatch_others.__code__, _set.__code__, install.__code__)


def children() -> frozenset[str]:
    """The running children of this thread (Linux ``/proc``; empty elsewhere): a process
    started from C in the watched thread, which raised no event."""
    try:
        with open("/proc/thread-self/children", encoding="ascii") as handle:
            return frozenset(handle.read().split())
    except OSError:
        return frozenset()
