"""The checks' one guard: which functions a learner's answer ran, however it reached them.

``CallsInto(*targets)`` records, while it is active, every Python call into a target: a file
(every function whose code lives there), a function or a code object (its nested functions
too). A call matches two ways:

* by identity: the target's code object is entered, whatever name it was reached by (an alias
  bound before the check, a wrapper, a lambda), or code from a target file;
* by content: a function whose bytecode, names and constants equal a target's (its docstring
  and line numbers aside, see ``code_fingerprint``). That is what ``exec`` of a helper's
  source makes, under any file name and at any line, and what pasting it under another name
  with its locals renamed makes. It catches exact copies only: a copy edited without changing
  what it computes (a ``+ 0``, two lines swapped) is other bytecode and is not matched.
  Comprehensions and lambdas match by identity only: a one-line
  ``[("F", b) for b in range(n)]`` is the same bytecode whoever writes it.

Code that ``tf.function`` traces runs as AutoGraph's converted copy: that copy is matched
through the original it was made from (``_converted``).

It watches the calling thread (``sys.setprofile``) and every thread started through
``threading`` while it is active (``threading.setprofile``). A thread started with
``_thread.start_new_thread`` gets no profiler: a direct call of it from Python code fails the
guard (the profiler sees the call), but one made from C (``map(_thread.start_new_thread, ...)``,
a ``functools.partial``) is not seen; Python 3.11 has neither the audit event
``_thread.start_new_thread`` nor ``threading.setprofile_all_threads`` (both 3.12). Threads
already running when it starts, and other processes, are out of its reach too. It notices
tampering: a ``sys.setprofile`` by anyone but the guard itself (an audit hook sees it, however
the call was made, even a save-and-restore; the guard's own calls are known by their call
chain, code objects and the frame that entered it, not by a flag anyone could set), a call of
``threading.setprofile``, or a profiler that is no longer its own when it is read. Then
``tampered`` holds why, and ``take()`` names it. What it cannot see: writes to the guard's own
attributes (it is reachable, e.g. as ``sys.getprofile().__self__``); a profiler sees calls,
not attribute stores.
"""

from __future__ import annotations

import _thread
import dis
import sys
import threading
import types
from pathlib import Path
from typing import Any

__all__ = ["RAW_THREAD", "REMOVED", "CallsInto", "code_fingerprint"]

REMOVED = "your function removed the check's profiler"
RAW_THREAD = "your function started a thread with _thread, which the check cannot watch"
_ANONYMOUS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")
_ACTIVE: list[CallsInto] = []  # the guards now installed
_THREAD_START = threading.Thread._bootstrap_inner.__code__  # installs threading's hook
_THREAD_STARTER = threading.Thread.start.__code__  # the one caller of _thread allowed
_THREADING_SETPROFILE = threading.setprofile.__code__
_AUTOGRAPH = "__autograph_generated_file"  # tensorflow/python/autograph/pyct/loader.py


def _instruction(instruction: dis.Instruction) -> tuple[str, Any]:
    """One instruction, the same however the compiler chose to spell a call: a method load is
    an attribute load, a global by its name (not its index, nor the "push NULL" bit); locals
    and jumps by index, so renamed locals look the same."""
    name = "LOAD_ATTR" if instruction.opname == "LOAD_METHOD" else instruction.opname
    if name in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_NAME"):
        return name, instruction.argval
    return name, instruction.arg


def code_fingerprint(code: types.CodeType) -> tuple[Any, ...]:
    """What a function does, without its names: its instructions (no line numbers, no inline
    caches, locals by index), global and attribute names, constants (the docstring left out,
    nested functions by their own fingerprint)."""
    consts = list(code.co_consts)
    if consts and isinstance(consts[0], str):  # the docstring, or the first string constant
        consts = consts[1:]
    instructions = tuple(_instruction(i) for i in dis.get_instructions(code)
                         if i.opname != "CACHE")
    return (instructions, code.co_names, code.co_argcount, code.co_kwonlyargcount,
            tuple(code_fingerprint(c) if isinstance(c, types.CodeType) else repr(c)
                  for c in consts))


def _quick_key(code: types.CodeType) -> tuple[Any, ...]:
    """A cheap part of the fingerprint: only codes that share it are fingerprinted."""
    return code.co_argcount, code.co_kwonlyargcount, code.co_names


def _target_codes(target: Any) -> list[types.CodeType]:
    """The code objects of a target: a file's (compiled from its source), a function's or a
    code object's, nested ones included."""
    if isinstance(target, (str, Path)):
        path = Path(target)
        stack = [compile(path.read_text(encoding="utf-8"), str(path), "exec")]
    else:
        stack = [getattr(target, "__code__", target)]
    codes = []
    while stack:
        code = stack.pop()
        codes.append(code)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return codes


def _by_a_guard(frame: Any) -> bool:
    """True when ``frame``, which sets a profiler, is a guard installing its own: its
    ``_install`` called by its ``__enter__`` or ``__exit__`` from the frame that entered it,
    or by its ``take``. Known by code objects and frames, not a flag anyone could set."""
    if frame is None or frame.f_code is not _INSTALL:
        return False
    method, guard = frame.f_back, frame.f_locals.get("self")
    if method is None or not isinstance(guard, CallsInto):
        return False
    if method.f_code is _TAKE:
        return True
    return method.f_code in _WITH and method.f_back is guard._owner


def _audit(event: str, args: Any) -> None:
    """Notes, in every active guard, a profiler set by someone else (the audit hook cannot be
    removed, and sees ``sys.setprofile`` however it is called)."""
    if event != "sys.setprofile" or not _ACTIVE:
        return
    caller = sys._getframe(1)
    if caller.f_code is _THREAD_START or _by_a_guard(caller):  # threading's hook, or ours
        return
    for guard in _ACTIVE:
        guard.tampered = f"{REMOVED} (sys.setprofile was called while it ran)"


sys.addaudithook(_audit)


class CallsInto:
    """Record every call, made while it is active (this thread and threads it starts), into
    one of the ``targets`` (files, functions or code objects), by identity or by content: a
    helper bound earlier under another name (``from course_utils.profiling import
    step_breakdown``) or an ``exec``'d copy of it is caught as surely as
    ``cu.profiling.step_breakdown``; no module attribute is replaced. ``also(frame)``, when
    given, is called on every Python call while it is active."""

    def __init__(self, *targets: Any, also: Any = None) -> None:
        self.files: set[str] = set()
        self.by_identity: dict[types.CodeType, str] = {}
        self.by_content: dict[tuple[Any, ...], str] = {}
        self.quick: set[tuple[Any, ...]] = set()
        for target in targets:
            if isinstance(target, (str, Path)):
                self.files.add(str(target))
            codes = _target_codes(target)
            top = getattr(target, "__name__", None) or codes[0].co_name
            for code in codes:
                name = code.co_name if code.co_name != "<module>" else top
                self.by_identity.setdefault(code, name)
                if code.co_name not in _ANONYMOUS + ("<module>",):
                    self.by_content.setdefault(code_fingerprint(code), name)
                    self.quick.add(_quick_key(code))
        self.also = also
        self.names: list[str] = []
        self.tampered: str | None = None
        self._seen: dict[types.CodeType, str | None] = {}
        self._hook = self._profile  # one bound method, compared by identity
        self._owner: Any = None  # the frame that entered it, while it is active

    def match(self, code: types.CodeType) -> str | None:
        """The target ``code`` is (its name), a copy of (``name (a copy of it)``), or None."""
        if code in self._seen:
            return self._seen[code]
        found = self.by_identity.get(code)
        if found is None and code.co_filename in self.files:
            found = code.co_name
        if (found is None and code.co_name not in _ANONYMOUS
                and _quick_key(code) in self.quick):
            copied = self.by_content.get(code_fingerprint(code))
            found = f"{copied} (a copy of it)" if copied else None
        self._seen[code] = found
        return found

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            if (event == "c_call" and getattr(arg, "__self__", None) is _thread
                    and arg.__name__ in ("start_new_thread", "start_new")
                    and frame.f_code is not _THREAD_STARTER):
                self.tampered = RAW_THREAD
            return
        code = frame.f_code
        if code is _THREADING_SETPROFILE and not _by_a_guard(frame.f_back):
            self.tampered = f"{REMOVED} (threading.setprofile was called while it ran)"
        if self.also is not None:
            self.also(frame)
        found = self.match(code)
        if found is None and code.co_name.startswith("tf__") and _AUTOGRAPH in code.co_filename:
            found = self._converted(frame)
        if found:
            self.names.append(found)

    def _converted(self, frame: Any) -> str | None:
        """A function AutoGraph converted (``tf.function`` tracing), matched through the
        original: AutoGraph names its copy ``tf__<name>`` and runs it with the original's
        globals, where ``<name>`` is the original (a function nested in another is matched
        through the outer one, converted with it)."""
        original = getattr(frame.f_globals.get(frame.f_code.co_name[4:]), "__code__", None)
        found = self.match(original) if isinstance(original, types.CodeType) else None
        return f"{found} (converted by AutoGraph)" if found else None

    def intact(self) -> bool:
        """False (and ``tampered`` set) once the profiler is not this guard's any more."""
        if self.tampered is None and (sys.getprofile() is not self._hook
                                      or threading.getprofile() is not self._hook):
            self.tampered = f"{REMOVED} (the profiler in place is not the check's)"
        return self.tampered is None

    def _install(self, profile: Any, thread_profile: Any) -> None:
        threading.setprofile(thread_profile)
        sys.setprofile(profile)

    def __enter__(self) -> CallsInto:
        self._owner = sys._getframe(1)  # the one frame whose `with` may exit it
        self._previous = sys.getprofile(), threading.getprofile()
        self.tampered = None
        _ACTIVE.append(self)
        self._install(self._hook, self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.intact()
        self._install(*self._previous)
        _ACTIVE.remove(self)
        self._owner = None

    def take(self) -> list[str]:
        """The targets called since the last ``take`` (each once), with the tampering first
        when the profiler was removed (it is put back while the guard is active)."""
        names, self.names = list(dict.fromkeys(self.names)), []
        if self in _ACTIVE and not self.intact():
            names.insert(0, self.tampered)
            self.tampered = None
            self._install(self._hook, self._hook)
        return names


_INSTALL = CallsInto._install.__code__
_TAKE = CallsInto.take.__code__
_WITH = (CallsInto.__enter__.__code__, CallsInto.__exit__.__code__)
