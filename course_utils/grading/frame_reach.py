"""Frames the learner's own code reaches while a check runs.

An answer runs in the check's process, under the check's frames: walking up to them reads the
expected result instead of computing it. The framework scans the answer's names for the frame
readers (``INTROSPECTION_NAMES``), which a name built at run time escapes
(``getattr(sys, "_get" + "frame")``). This watch sees the reading itself: Python raises an
audit event for every way to obtain a frame (``sys._getframe``, ``sys._current_frames``, a
traceback's ``tb_frame``, a generator's or coroutine's ``gi_frame``/``cr_frame``/``ag_frame``),
and to trace every frame (``sys.settrace``); a search of the garbage collector's objects is
the registry's to name (``registry.register``). While :func:`watching` is
active (in any thread: a thread the answer starts too), each such event raised by code that is
neither Python's nor an installed package's nor the course's (a notebook cell, a learner's
module, an ``exec``'d string) is recorded; ``inspect`` and ``traceback`` are looked through to
the code that called them. ``logging``, ``collections.namedtuple``, TensorFlow and Keras read
frames for their own reasons and are not the learner's code.

A signal handler is handed the frame the signal interrupted, with no audit event, and so is a
profile or trace function set before the check: :func:`learners_hooks` names those of the
learner's code (checked before and after each case). ``bdb`` and ``pdb`` are looked through
like ``inspect`` (a ``breakpoint()`` in an answer counts), and so is ``logging.currentframe``
(not ``logging``'s own calls of it), and TensorFlow's ``tf_inspect``; code ``compile``d under
a library's file name is the learner's (it does not run in that module's namespace). Not seen: a
signal handler the answer installs, triggers and takes out within one call; another library's
function that hands its caller a frame; memory read through ``ctypes``.
"""

from __future__ import annotations

import bdb
import contextlib
import functools
import inspect
import logging
import pdb
import signal
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from pathlib import Path

__all__ = ["code_key", "learners_file", "learners_hooks", "source_codes", "watching"]

# not "sys.setprofile": the check's own guards install profilers in TensorFlow's threads, and
# Python run in that event's hook raced them (a replica thread failed: the check hung); a
# profiler of the learner's is named by learners_hooks, and by call_guard where it watches
_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys.settrace"})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_WALKERS = frozenset({inspect.__file__, traceback.__file__, bdb.__file__, pdb.__file__})
_HANDS_FRAMES = frozenset({logging.currentframe.__code__})  # returns its caller's frame
_TF_INSPECT = str(Path("tensorflow", "python", "util", "tf_inspect.py"))  # inspect's wrapper
_PACKAGE = str(Path(__file__).resolve().parent.parent)
_PREFIXES = tuple({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                     sys.base_exec_prefix)}
                  | {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})

_active: list[list[str]] = []  # one record per watch in progress (nested checks: each)
_inside = threading.local()  # the hook's own sys._getframe raises the event again


def _learners(filename: str) -> bool:
    return not (filename.startswith(_PREFIXES) or filename.startswith(_PACKAGE)
                or filename.startswith("<frozen"))


def _learners_frame(frame: object) -> bool:
    """Whether ``frame`` runs the learner's code: by its file, and where it claims a library's
    or the course's file, by its code, which must be compiled from that file's source (code
    ``compile``d under a library's file name is the learner's)."""
    code = frame.f_code  # type: ignore[attr-defined]
    if _learners(code.co_filename):
        return True
    # a library's code runs in its own module's namespace, whose file it names
    module = sys.modules.get(frame.f_globals.get("__name__", ""))  # type: ignore[attr-defined]
    return getattr(module, "__file__", None) != code.co_filename


def code_key(code: types.CodeType) -> tuple:
    """What tells one compiled function from another, line numbers aside but the first."""
    return code.co_qualname, code.co_firstlineno, code.co_code, code.co_names


@functools.lru_cache(maxsize=512)
def source_codes(file: str) -> frozenset | None:
    """The keys of every code object compiled afresh from ``file`` (cached per process): a
    function compiled elsewhere under this file's name (``exec(compile(..., file))``) has
    other code, or another first line, than any of them. None where the source cannot be
    read (an install without it): the file name alone then decides."""
    try:
        found, stack = set(), [compile(Path(file).read_text(), file, "exec")]
    except (OSError, SyntaxError, ValueError):
        return None
    while stack:
        code = stack.pop()
        found.add(code_key(code))
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(found)


def learners_file(filename: str) -> bool:
    """Whether code from ``filename`` is the learner's: not Python's, an installed package's
    or the course's (the repository's tests count as the learner's)."""
    return _learners(filename)


def _hook(event: str, args: tuple) -> None:
    if not _active:
        return
    if event not in _EVENTS and not (event == "object.__getattr__" and len(args) > 1
                                     and args[1] in _FRAME_ATTRIBUTES):
        return
    if getattr(_inside, "busy", False):
        return
    _inside.busy = True
    try:
        frame = sys._getframe(1)
        if frame.f_code in _HANDS_FRAMES:  # logging.currentframe(): its caller's
            frame = frame.f_back
        while frame is not None and (frame.f_code.co_filename in _WALKERS
                                     or frame.f_code.co_filename.endswith(_TF_INSPECT)):
            frame = frame.f_back  # inspect.stack(), traceback.walk_stack(): their caller
        if frame is not None and _learners_frame(frame):
            what = args[1] if event == "object.__getattr__" else event
            where = f"{Path(frame.f_code.co_filename).name}, line {frame.f_lineno}"
            for record in _active:
                record.append(f"{what} ({where})")
    finally:
        _inside.busy = False


def learners_hooks() -> list[str]:
    """The learner's own code set where Python hands it frames: a signal handler (handed the
    interrupted frame, with no audit event), a profile or trace function of this thread or of
    the threads ``threading`` starts (set before the check, or by ``threading.setprofile``)."""
    found = [what for what, hook in (("sys.setprofile", sys.getprofile()),
                                     ("sys.settrace", sys.gettrace()),
                                     ("threading.setprofile", threading.getprofile()),
                                     ("threading.settrace", threading.gettrace()))
             if _learners_code(hook)]
    for number in sorted(signal.valid_signals()):
        try:
            handler = signal.getsignal(number)
        except (ValueError, OSError):  # a signal this platform does not let Python handle
            continue
        if _learners_code(handler):
            try:
                found.append(f"a signal handler for {signal.Signals(number).name}")
            except ValueError:  # a real-time signal has no name
                found.append(f"a signal handler for signal {number}")
    return found


def _learners_code(hook: object) -> bool:
    code = getattr(inspect.unwrap(hook), "__code__", None) if callable(hook) else None
    return code is not None and _learners(code.co_filename)


@contextlib.contextmanager
def watching() -> Iterator[list[str]]:
    """Inside the block, the frame readings of the learner's code are appended to the list it
    gives (``"sys._getframe (cell.py, line 3)"``)."""
    record: list[str] = []
    _active.append(record)
    try:
        yield record
    finally:
        del _active[next(i for i, each in enumerate(_active) if each is record)]


sys.addaudithook(_hook)  # an audit hook cannot be removed: it does nothing outside a watch
