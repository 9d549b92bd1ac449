"""The checks' one guard: which functions a learner's answer ran, however it reached them.

``CallsInto(*targets)`` records, while it is active, every Python call into a target: a file
(every function whose code lives there), a function or a code object (its nested functions
too). A call matches by identity (the target's code object is entered, whatever name reached
it: an alias bound before the check, a wrapper, a lambda; or code from a target file) or by
content (a function whose bytecode, names and constants equal a target's, docstring and line
numbers aside: an ``exec``'d or pasted copy, locals renamed; see ``code_fingerprint``). Only
exact copies match: a copy edited without changing what it computes (a ``+ 0``, two lines
swapped, an ``ast``-edited copy) is other bytecode. Comprehensions and lambdas match by
equality (``code.__eq__``: bytecode, names, constants, lines; not the file): a copy on the
same lines matches. AutoGraph's converted copy (``tf.function``) is matched through its original.

**Threads.** The profiler (``sys.setprofile``) watches the calling thread, every thread
started through ``threading`` while it is active (``threading.setprofile``), and every thread
already running when it starts (an executor's workers made in an earlier cell): on CPython
3.11 it sets each one's profiler as 3.12's ``threading.setprofile_all_threads`` does
(``guard_threads.watch_others``) and gives back what each had when it stops. A thread started
any other way cannot be profiled on 3.11 (nor is there an audit event for it), so the guard
counts: CPython numbers every thread state it makes, and the guard reads the next number
(``guard_threads.probe``) when it starts and at each verdict. A thread state made in between
by anything but a ``threading`` thread that installed the guard's profiler is Python run where
the check cannot watch: a ``_thread`` thread started from C (``map(_thread.start_new_thread,
...)``, a ``functools.partial``), or TensorFlow's threads running a ``tf.py_function`` or a
generator (``RAW_THREAD``; ``tensorflow_threads=True`` where the answer is handed a dataset:
``refusals``). A call of ``_thread.start_new_thread`` from Python is seen as it happens.

**Processes** started while it is active are named (``PROCESS``): the audit events ``os.fork``,
``os.forkpty``, ``os.posix_spawn``, ``os.system``, ``os.exec``, ``os.spawn``,
``subprocess.Popen``, a ``fork``/``exec``/``spawn``/``system`` looked up through ``ctypes``
(3.11 raises them in the parent, before the child exists); ``_posixsubprocess.fork_exec``
(``multiprocessing``'s spawn and forkserver: no event), seen as the profiler's ``c_call``; a
child of the watched thread still running at the verdict (``/proc``). A child that ended is
not counted: TensorFlow's C++ starts and waits for some (``ptxas`` on a GPU).

**Tampering** is named (``REMOVED``): a ``sys.setprofile`` by anyone but the guard (an audit
hook sees it however it is called, even a save-and-restore; the guard's own calls are known by
their call chain and the frame that entered it, as logged, not by a flag), a call of
``threading.setprofile``, a profiler no longer the guard's when read, the guard exited by the
function it watches.

**The record** is not kept on the guard (no instance dict, no list to clear): it is appended
to one log per process (``guard_code.Log``: the entries and a running SHA-256 digest, which
cannot be rewound), reached through the guard's functions' own code constants
(``guard_code.anchored``), not a name anyone can rebind; reading those constants, replacing
any function's code, or searching the garbage collector's objects are logged. A log cleared,
cut or rewritten no longer matches its digest; a guard whose tables were replaced, whose notes
were filled in, that was started or entered again, or whose verdict the watched function read,
no longer matches its log (``FORGED``). Each verdict checks the log from its guard's start
(the digest there is kept): a later check is not failed by an earlier one's broken log. But an
answer that reaches the log (each way logged) and appends entries that agree with the digest,
a false start of its guard, hides what came before: the log shows removal, not an appender
who knows its format.

What it still cannot see: threads already running, on another Python than CPython 3.11; a
``threading.Thread`` subclass that rewrites threading's own start-up methods to run code
before the profiler is installed; code that rewrites the check's own modules or classes
(``CallsInto.take = ...``, ``refusals.refusing = ...``) or memory through ``ctypes``; an
edited copy of a helper. None of these is a learner's mistake; the exercises make the helper
unable to answer their task where they can.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

from course_utils.grading.checks import guard_threads
from course_utils.grading.checks.guard_code import (  # the messages: re-exported here
    ANCHORED,
    ANONYMOUS,
    FORGED,
    PROCESS,
    RAW_THREAD,
    REMOVED,
    WATCHING,
    Log,
    anchored,
    autograph_original,
    code_fingerprint,
    quick_key,
    searches,
    target_codes,
    watching_problem,
)

try:
    import _posixsubprocess as _POSIXSUBPROCESS  # subprocess's and multiprocessing's
except ImportError:  # not POSIX
    _POSIXSUBPROCESS = None

__all__ = ["FORGED", "PROCESS", "RAW_THREAD", "REMOVED", "WATCHING", "CallsInto",
           "code_fingerprint", "watching_problem"]

_THREAD_START = threading.Thread._bootstrap_inner.__code__  # installs threading's hook
_THREAD_STARTER = threading.Thread.start.__code__  # the one caller of _thread allowed
_THREADING_SETPROFILE = threading.setprofile.__code__
_AUTOGRAPH = "__autograph_generated_file"  # tensorflow/python/autograph/pyct/loader.py
_AUTOGRAPH_CALLS = f"{os.sep}tensorflow{os.sep}python{os.sep}autograph{os.sep}impl{os.sep}"
_PROCESS_EVENTS = frozenset(("os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec",
                             "os.spawn", "subprocess.Popen", "os.startfile", "pty.spawn"))
_PROCESS_SYMBOLS = ("fork", "vfork", "clone", "exec", "posix_spawn", "system", "popen",
                    "spawn", "syscall")
_WATCHING = WATCHING
_SEARCHES = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents"))
_UNSEEN = object()
_SETTLE = 5  # waits of 2 ms for threads still starting, before a verdict counts them


def _start_of(guard: Any) -> tuple[Any, ...] | None:
    """The guard's last start in the log (its ``mark`` entry), read from the log alone."""
    log: Any = "<the check's log>"  # the log itself, put there by _anchored
    entries = log.entries
    return next((entries[i] for i in range(len(entries) - 1, -1, -1)
                 if entries[i][0] == "mark" and entries[i][1] == id(guard)), None)


def _owner_of(guard: Any) -> int:
    """The ``id`` of the frame that entered ``guard``, as logged when it did (0: none)."""
    start = _start_of(guard)
    return start[7] if start is not None else 0


def _by_a_guard(frame: Any) -> bool:
    """True when ``frame``, which sets a profiler, is a guard installing its own: its
    ``_install`` called by its ``__enter__``, or by its ``__exit__`` or ``take`` called from
    the frame that entered it (as logged). Known by code objects and frames, not a flag anyone
    could set."""
    while frame is not None and frame.f_code in guard_threads.INSTALLERS:  # from _install
        frame = frame.f_back
    if frame is None or frame.f_code is not _INSTALL:
        return False
    method, guard = frame.f_back, frame.f_locals.get("self")
    if method is None or not isinstance(guard, CallsInto):
        return False
    if method.f_code is _ENTER:
        return True
    return method.f_code in _WITH and _from_the_check(method, guard)


def _from_the_check(method: Any, guard: Any) -> bool:
    """True when ``method`` (a frame of the guard's) was called by the frame that entered the
    guard, or by the course's code that frame called: no frame between them runs code from
    outside ``course_utils`` (the learner's answer) but AutoGraph's ``converted_call`` (a
    refusal traced in a ``tf.function`` calls the guard through it)."""
    owner = _owner_of(guard)
    frame = method.f_back
    while frame is not None and id(frame) != owner:  # the owner is alive: its id is its own
        file = frame.f_code.co_filename
        if not file.startswith(_PACKAGE) and _AUTOGRAPH_CALLS not in file:
            return False
        frame = frame.f_back
    return frame is not None


def _audit(event: str, args: Any) -> None:
    """Logs, from any thread, a profiler set by someone else, threading's install of it in a
    thread it starts, a process started, the log reached (an audit hook cannot be removed)."""
    log: Any = "<the check's log>"  # the log itself, put there by _anchored
    if _PROCESS_EVENTS is None:  # the interpreter is ending: it has wiped this module's names
        return
    if event == "sys.setprofile":
        caller = sys._getframe(1)
        if caller.f_code is _THREAD_START:
            log.add("thread", 0, threading.get_ident())
        elif not _by_a_guard(caller):
            log.add("tamper", 0, f"{REMOVED} (sys.setprofile was called while it ran)")
    elif event in _PROCESS_EVENTS:
        log.add("tamper", 0, f"{PROCESS} ({event})")
    elif event == "ctypes.dlsym" and len(args) > 1 and isinstance(args[1], str) and any(
            args[1].startswith(name) for name in _PROCESS_SYMBOLS):
        log.add("tamper", 0, f"{PROCESS} (ctypes looked up {args[1]})")
    elif event in _SEARCHES:
        log.add("tamper", 0, f"{FORGED} (it searched the garbage collector's objects, "
                             f"{event})")
    elif (event in ("object.__setattr__", "object.__getattr__") and len(args) > 1
          and args[1] == "__code__" and isinstance(args[0], types.FunctionType)
          and (event == "object.__setattr__" or id(args[0]) in ANCHORED)):
        log.add("tamper", 0, f"{FORGED} (the code of {args[0].__qualname__} was "
                             + ("replaced)" if event == "object.__setattr__" else "read)"))


class CallsInto:
    """Record every call, made while it is active (this thread and threads it starts), into
    one of the ``targets`` (files, functions or code objects), by identity or by content: a
    helper bound earlier under another name or an ``exec``'d copy of it is caught as surely as
    the helper; no module attribute is replaced. ``also(frame, c_fn)``, when given, is called
    on every call while it is active (``c_fn`` None for Python's). ``take()`` is the verdict:
    the targets called, after what went wrong with the watching itself (see the module).
    ``tensorflow_threads=True`` where the check hands the answer a dataset whose Python (a
    generator) TensorFlow's threads run when it is read: thread states made while it watches
    are then not counted (a ``_thread`` thread started from Python is still named)."""

    # no instance dict: an attribute cannot hide a method; the tables are checked each verdict
    __slots__ = ("_hook", "_logged", "_names", "_others", "_previous", "_seen", "also",
                 "content", "files", "identity", "quick", "target_names",
                 "tensorflow_threads")

    def __init__(self, *targets: Any, also: Any = None,
                 tensorflow_threads: bool = False) -> None:
        files: set[str] = set()
        names: dict[types.CodeType, str] = {}
        content: dict[tuple[Any, ...], str] = {}
        for target in targets:
            if isinstance(target, (str, Path)):
                files.add(str(target))
            codes = target_codes(target)
            top = getattr(target, "__name__", None) or codes[0].co_name
            for code in codes:
                names.setdefault(code, code.co_name if code.co_name != "<module>" else top)
                if code.co_name not in ANONYMOUS + ("<module>",):
                    content.setdefault(code_fingerprint(code), names[code])
        # immutable tables; what they were is logged at each start, so a table replaced by
        # another is noticed
        self.files = frozenset(files)
        self.identity = frozenset(names)
        self.content = frozenset(content.items())
        self.quick = frozenset(quick_key(code) for code in names
                               if code.co_name not in ANONYMOUS + ("<module>",))
        self._names = names  # only to name what was found: membership is `identity`
        self.target_names = frozenset(code.co_name for code in names)
        self.also = also
        self.tensorflow_threads = bool(tensorflow_threads)
        self._logged: set[str] = set()  # names logged since the last mark (checked against it)
        self._seen: dict[types.CodeType, str | None] = {}  # each code's match, once
        self._hook = self._profile  # one bound method, compared by identity
        self._previous: Any = (None, None)
        self._others: dict[int, Any] = {}  # other threads' profilers, while it watches them

    def _tables(self) -> int:
        return hash((self.files, self.identity, self.content, self.quick, self.target_names,
                     id(self.also), self.tensorflow_threads))

    def _copy_of(self, code: types.CodeType) -> str | None:
        fingerprint = code_fingerprint(code)
        copied = next((name for key, name in self.content if key == fingerprint), None)
        return f"{copied} (a copy of it)" if copied else None

    def match(self, code: types.CodeType) -> str | None:
        """The target ``code`` is (its name), a copy of (``name (a copy of it)``), or None:
        worked out once per code object (each verdict checks what was kept)."""
        found = self._seen.get(code, _UNSEEN)
        if found is _UNSEEN:
            found = self._seen[code] = self._match(code)
        return found

    def _match(self, code: types.CodeType) -> str | None:
        if code in self.identity:
            return self._names.get(code) or code.co_name
        if code.co_filename in self.files:
            return code.co_name
        if code.co_name in ANONYMOUS or quick_key(code) not in self.quick:
            return None
        return self._copy_of(code)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            if event == "c_call":
                if self.also is not None:
                    self.also(frame, arg)
                module = getattr(arg, "__self__", None)
                if (module is _thread and arg.__name__ in ("start_new_thread", "start_new")
                        and frame.f_code is not _THREAD_STARTER):
                    self._note("tamper", RAW_THREAD)
                elif module is not None and module is _POSIXSUBPROCESS:
                    self._note("tamper", f"{PROCESS} (_posixsubprocess.{arg.__name__})")
            return
        code = frame.f_code
        if code is _THREADING_SETPROFILE and not _by_a_guard(frame.f_back):
            self._note("tamper", f"{REMOVED} (threading.setprofile was called while it ran)")
        if self.also is not None:
            self.also(frame, None)
        found = self.match(code)
        if found is None and code.co_name.startswith("tf__") and _AUTOGRAPH in code.co_filename:
            found = self._converted(frame)
        if found and found not in self._logged:
            self._logged.add(found)
            self._note("call", found)

    def _note(self, kind: str, what: str) -> None:
        """Adds evidence (a call, or tampering) to the log; nothing else."""
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        if kind == "call" and what:
            log.add("call", id(self), what)
        else:
            log.add("tamper", id(self), what if kind == "tamper" and what.startswith(
                _WATCHING) else f"{FORGED} (a note was forged)")

    def _converted(self, frame: Any) -> str | None:
        """AutoGraph's copy, matched through its original (``guard_code.autograph_original``)."""
        original = autograph_original(frame)
        found = self.match(original) if original is not None else None
        return f"{found} (converted by AutoGraph)" if found else None

    def _mark(self, hook: Any, owner: int) -> None:
        """Log where this guard's record starts (again): its tables, its profiler, the frame
        that entered it, and the counts the next verdict compares with (thread states made,
        running children)."""
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        if sys._getframe(1).f_code not in (_ENTER, _TAKE):
            log.add("tamper", id(self), f"{FORGED} (its record was started again by hand)")
            return
        self._logged = set()
        log.add("mark", id(self), id(hook) if hook is not None else 0, self._tables(),
                guard_threads.probe(), 0, guard_threads.children(), owner)

    def _active(self) -> bool:
        """Entered and not exited since, as logged."""
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        for entry in reversed(log.entries):
            if entry[1] == id(self) and entry[0] in ("mark", "exit"):
                return entry[0] == "mark" and entry[2] != 0
        return False

    def _verdict(self, installed: Any = None) -> tuple[list[str], list[str]]:
        """What went wrong with the watching since the last mark (the first reason of each
        kind), and the targets called; read from the log alone (and ``installed``, the
        profilers in place when the verdict was asked for)."""
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        entries = log.entries
        start = None
        for i in range(len(entries) - 1, -1, -1):  # loops, not generators: each resumed
            if entries[i][0] == "mark" and entries[i][1] == id(self):  # generator is a call
                start = i
                break
        if not log.intact(start if start is not None else -1):
            return [f"{FORGED} (its log was cleared or rewritten: restart the kernel)"], []
        if start is None:
            return [], []
        _, _, hook, tables, serial, _, started_with, _ = entries[start]
        window = entries[start + 1:]
        problems = [e[2] for e in window if e[0] == "tamper"]
        called = [e[2] for e in window if e[0] == "call" and e[1] == id(self)]
        seen = self._seen
        changed = (tables != self._tables() or type(self._logged) is not set
                   or set(self._logged) != set(called) or type(seen) is not dict)
        for code, found in list(seen.items()) if not changed else ():
            if found is None and code.co_name not in self.target_names and not (
                    code.co_filename in self.files or quick_key(code) in self.quick):
                continue  # cannot be a target: nothing to check (cheaply)
            if found != self._match(code):
                changed = True
                break
        if changed:
            problems.insert(0, f"{FORGED} (the guard's tables, or what it noted, were "
                               "changed)")
        exited = [e for e in window if e[0] == "exit" and e[1] == id(self)]
        profilers = installed or (sys.getprofile(), threading.getprofile())
        if hook and not exited and (id(profilers[0]) != hook or id(profilers[1]) != hook):
            problems.append(f"{REMOVED} (the profiler in place is not the check's)")
        if not guard_threads.children() <= started_with:
            problems.append(f"{PROCESS} (a child process ran while it was watched)")
        now = guard_threads.probe()
        log.add("probe", 0, now)
        if serial >= 0 and not self.tensorflow_threads:
            consumed = [e[2] if e[0] == "probe" else e[4] for e in window
                        if e[0] in ("probe", "mark")]
            made = now - serial - 1 - len([n for n in consumed if serial < n < now])
            for _ in range(_SETTLE):  # a threading thread just started installs the
                watched = len([e for e in entries[start + 1:] if e[0] == "thread"])
                if made <= watched:  # profiler a few instructions after start() returns
                    break
                time.sleep(0.002)
            else:
                problems.append(RAW_THREAD)
        return list(dict.fromkeys(problems)), list(dict.fromkeys(called))

    @property
    def tampered(self) -> str | None:
        """The first thing that went wrong with the watching since the last ``take`` (None)."""
        problems, _ = self._verdict()
        return problems[0] if problems else None

    def _install(self, profile: Any, thread_profile: Any, others: bool = True) -> None:
        threading.setprofile(thread_profile)
        if others and profile is not self._hook:
            guard_threads.unwatch_others(self._hook, self._others)
        guard_threads.install(profile)  # sys.setprofile, once no other thread is installing one
        if others and profile is self._hook:
            guard_threads.watch_others(self._hook, self._others)

    def __enter__(self) -> CallsInto:
        if self._active():
            self._note("tamper", f"{FORGED} (the guard was entered again while it ran)")
            return self
        self._previous = sys.getprofile(), threading.getprofile()
        self._install(self._hook, self._hook)
        self._mark(self._hook, id(sys._getframe(1)))  # the frame whose `with` may exit it
        return self

    def __exit__(self, *exc: Any) -> None:
        if not _from_the_check(sys._getframe(0), self):
            self._note("tamper", f"{REMOVED} (the guard was exited by the function it "
                                 "watches)")
            return
        if sys.getprofile() is not self._hook or threading.getprofile() is not self._hook:
            self._note("tamper", f"{REMOVED} (the profiler in place is not the check's)")
        self._install(*self._previous)
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        log.add("exit", id(self), "")

    def take(self) -> list[str]:
        """The targets called since the last ``take`` (each once), with what went wrong with
        the watching first (the profiler is put back while the guard is active; a thread it
        could not watch comes after the targets seen called); starts the record again.
        Called from the function it watches, it starts nothing again and is named as a
        forgery."""
        active = self._active()
        if active and not _from_the_check(sys._getframe(0), self):
            self._note("tamper", f"{FORGED} (the function it watches read its verdict)")
            return []
        installed = sys.getprofile(), threading.getprofile()
        if active:  # the verdict's own calls are not watched (this thread only)
            self._install(None, installed[1], others=False)
        problems: list[str] = []
        try:
            problems, called = self._verdict(installed)
            self._mark(self._hook if active else None, _owner_of(self) if active else 0)
        finally:
            if active:  # put back; where it was removed, every thread's
                self._install(self._hook, self._hook, others=bool(problems))
        if problems[:1] == [RAW_THREAD] and called:  # a helper seen is the plainer message
            return [*called, RAW_THREAD]
        return [*problems[:1], *called]


# AutoGraph calls the guard's methods as they are (a copy made from source lacks the log)
for _method in vars(CallsInto).values():
    _method = getattr(_method, "fget", _method)
    if isinstance(_method, types.FunctionType):
        _method.autograph_info__ = {}  # tensorflow/python/autograph/impl/api.py
_INSTALL = CallsInto._install.__code__
_ENTER = CallsInto.__enter__.__code__
_TAKE = CallsInto.take.__code__
_LOG = Log()  # from here on held only in these functions' code constants
for _function in (_start_of, _audit, searches, CallsInto._note, CallsInto._mark,
                  CallsInto._active, CallsInto._verdict, CallsInto.__exit__):
    anchored(_function, _LOG)
os.register_at_fork(after_in_child=_LOG.after_fork)
del _function, _method, _LOG  # from now on only the functions' constants hold the log
_WITH = (CallsInto.__exit__.__code__, _TAKE)  # __exit__'s code as anchored
_PACKAGE = (str(Path(__file__).parents[2]), str(Path(__file__).resolve().parents[2]))
sys.addaudithook(_audit)
