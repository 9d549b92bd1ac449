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
  what it computes (a ``+ 0``, two lines swapped, an ``ast``-edited copy) is other bytecode
  and is not matched. Comprehensions and lambdas match by identity only: a one-line
  ``[("F", b) for b in range(n)]`` is the same bytecode whoever writes it.

Code that ``tf.function`` traces runs as AutoGraph's converted copy: that copy is matched
through the original it was made from (``_converted``).

**Threads.** The profiler (``sys.setprofile``) watches the calling thread, every thread
started through ``threading`` while it is active (``threading.setprofile``), and every thread
already running when it starts (an executor's workers made in an earlier cell): on CPython
3.11 it sets each one's profiler the way 3.12's ``threading.setprofile_all_threads`` does
(``_PyEval_SetProfile`` per thread state, ``_watch_others``) and gives back what each had
when it stops. A thread started any other way cannot be profiled on 3.11 (no audit event
``_thread.start_new_thread`` either), so the guard counts: CPython numbers every thread state
it makes, and the guard reads the next number (it makes one itself, ``_probe``) when it
starts and at each verdict. A thread state made in between by anything but a ``threading``
thread that installed the guard's profiler is Python run where the check cannot watch: a
``_thread`` thread started from C (``map(_thread.start_new_thread, ...)``, a
``functools.partial``), or TensorFlow's own threads running a ``tf.py_function``,
``tf.numpy_function`` or ``Dataset.from_generator``. The verdict names it (``RAW_THREAD``);
a call of ``_thread.start_new_thread`` from Python is seen as it happens.

**Processes.** A process started while a guard is active is named (``PROCESS``): the audit
events ``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.system``, ``os.exec``,
``os.spawn``, ``subprocess.Popen`` (``os.popen`` too), a ``fork``/``exec``/``spawn``/
``system`` looked up through ``ctypes``; what raises no event, ``multiprocessing``'s
``spawn`` and ``forkserver`` starting their children with ``_posixsubprocess.fork_exec``, is
seen as the profiler's ``c_call`` of it; and a child of the watched thread still running at
the verdict that was not there at the start (``/proc``). Python 3.11 raises these events in the
parent, before the child exists. Children that TensorFlow's own C++ code starts and waits for
(``ptxas`` on a GPU) are not counted: a child that ended is not a sign of the answer's.

**Tampering.** A ``sys.setprofile`` by anyone but the guard itself (an audit hook sees it,
however the call was made, even a save-and-restore; the guard's own calls are known by their
call chain, code objects and the frame that entered it, as logged, not by a flag anyone could
set), a call of ``threading.setprofile``, a profiler that is no longer the guard's when it is
read, and the guard exited by the function it watches are named (``REMOVED``).

**The record.** What the guard saw is not kept on the guard: it is appended to one log per
process (``_Log``), a tuple of the entries and a running SHA-256 digest, which cannot be
rewound. The guard's functions reach it through their own code constants (``_anchored``), not
a name anyone can rebind; reading those constants (``__code__``), replacing any function's
code, or searching the garbage collector's objects are audit events the guard logs. A log
that was cleared, cut or rewritten no longer matches its digest; a guard whose tables were
replaced, whose notes were filled in by hand, that was started again, entered again, or whose
verdict the watched function read, no longer matches its log. Each is named (``FORGED``): the
guard has no instance dict (no attribute hides a method) and no list to clear. Each verdict
checks the log from its guard's start on (the digest as it was there is kept), so a later
check is not failed by an earlier one's broken log. But
an answer that reaches the log itself (through the garbage collector or the guard's code, each
logged) and appends well-formed entries that agree with the digest, a false start of its
guard, hides what came before that start: the log shows removal, not an appender who knows
its format.

What it still cannot see: threads already running when it starts, on another Python than
CPython 3.11 (their profilers are left alone there); a ``threading.Thread``
subclass that rewrites threading's own start-up methods to run code before the profiler is
installed; code that rewrites the check's own modules or classes (``CallsInto.take = ...``,
``refusals.refusing = ...``) or writes memory through ``ctypes``; an edited copy of a helper
(see above). An answer that does any of these is not a learner's mistake; the exercises make
the helper unable to answer their task where they can.
"""

from __future__ import annotations

import _thread
import ctypes
import dis
import hashlib
import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

try:
    import _posixsubprocess as _POSIXSUBPROCESS  # subprocess's and multiprocessing's
except ImportError:  # not POSIX
    _POSIXSUBPROCESS = None

__all__ = ["FORGED", "PROCESS", "RAW_THREAD", "REMOVED", "WATCHING", "CallsInto",
           "code_fingerprint", "watching_problem"]

REMOVED = "your function removed the check's profiler"
RAW_THREAD = ("your function ran Python in a thread the check cannot watch (a thread started "
              "with _thread, or TensorFlow's own threads running a tf.py_function or a "
              "generator)")
PROCESS = "your function started a process, which the check cannot watch"
FORGED = "your function changed the check's record of what it called"
_ANONYMOUS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")
_THREAD_START = threading.Thread._bootstrap_inner.__code__  # installs threading's hook
_THREAD_STARTER = threading.Thread.start.__code__  # the one caller of _thread allowed
_THREADING_SETPROFILE = threading.setprofile.__code__
_AUTOGRAPH = "__autograph_generated_file"  # tensorflow/python/autograph/pyct/loader.py
_AUTOGRAPH_CALLS = f"{os.sep}tensorflow{os.sep}python{os.sep}autograph{os.sep}impl{os.sep}"
_PROCESS_EVENTS = frozenset(("os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.exec",
                             "os.spawn", "subprocess.Popen", "os.startfile", "pty.spawn"))
_PROCESS_SYMBOLS = ("fork", "vfork", "clone", "exec", "posix_spawn", "system", "popen",
                    "spawn", "syscall")
WATCHING = (REMOVED, RAW_THREAD, PROCESS, FORGED)  # what can go wrong with the watching
_WATCHING = WATCHING
_SEARCHES = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents"))
_UNSEEN = object()
_SETTLE = 5  # waits of 2 ms for threads still starting, before a verdict counts them
_HERE = "<the check's log>"  # replaced, in the functions' constants, by the log itself


class _Log(tuple):
    """Append-only: ``(entries, digest, [lock, digests at each start])``, every entry also fed
    to a SHA-256 digest, which cannot be rewound, so a list that was cleared, cut or rewritten
    no longer matches it (``intact``). A tuple without attributes: no part can be swapped for
    another. The guard's functions reach it through their own code constants (``_anchored``),
    and reading those (``__code__``), or searching the garbage collector's objects, is an audit
    event the guard logs."""

    __slots__ = ()

    # by identity: a code object that holds it as a constant is hashed and compared
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __new__(cls) -> _Log:
        # the lock keeps the list and the digest in the same order when threads add at once;
        # the digest as it was after each start ("mark") lets a verdict check its own window
        # without hashing the whole log again
        return super().__new__(cls, ([], hashlib.sha256(), [_thread.allocate_lock(), {}]))

    @staticmethod
    def _key(entry: tuple[Any, ...]) -> bytes:
        return repr(entry).encode() + b"\0"

    @property
    def entries(self) -> list[tuple[Any, ...]]:
        return self[0]

    def add(self, *entry: Any) -> None:
        with self[2][0]:
            self[0].append(entry)
            self[1].update(repr(entry).encode() + b"\0")  # _key, inlined: no call
            if entry[0] == "mark":
                self[2][1][len(self[0]) - 1] = self[1].copy()

    def intact(self, since: int = -1) -> bool:
        """Whether the entries after ``since`` (a mark's place; -1: all) are those the digest
        was fed."""
        with self[2][0]:
            start = self[2][1].get(since)
            digest = start.copy() if start is not None else hashlib.sha256()
            for entry in self[0][since + 1 if start is not None else 0:]:
                digest.update(repr(entry).encode() + b"\0")  # _key, inlined
            return digest.digest() == self[1].digest()

    def after_fork(self) -> None:
        """A child of ``fork`` gets a new lock (another thread may have held the old one)."""
        self[2][0] = _thread.allocate_lock()


_LOG = _Log()
_ANCHORED: set[int] = set()  # the ids of the functions that hold the log


def _anchored(function: Any, log: _Log) -> Any:
    """``function`` with the constant ``_HERE`` replaced by the log: what it reads the log
    through is its own code, which only an audited ``__code__`` assignment could replace,
    and an audited ``__code__`` read could reach."""
    code = function.__code__
    function.__code__ = code.replace(co_consts=tuple(
        log if isinstance(c, str) and c == _HERE else c for c in code.co_consts))
    _ANCHORED.add(id(function))
    return function


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


def _probe() -> int:
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


def _watch_others(hook: Any, saved: dict[int, Any]) -> None:
    """``hook`` (already this thread's profiler) made every other thread's too: threads that
    were running before the guard started (an executor's workers made earlier). What each
    had is kept in ``saved`` (by thread state) for ``_unwatch_others``."""
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


def _unwatch_others(hook: Any, saved: dict[int, Any]) -> None:
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


def _children() -> frozenset[str]:
    """The running children of this thread (Linux ``/proc``; empty elsewhere): a process
    started from C in the watched thread, which raised no event."""
    try:
        with open("/proc/thread-self/children", encoding="ascii") as handle:
            return frozenset(handle.read().split())
    except OSError:
        return frozenset()


def watching_problem(names: list[str]) -> str | None:
    """The first of ``take()``'s names when it says what went wrong with the watching."""
    return names[0] if names and names[0].startswith(WATCHING) else None


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
    if frame is not None and frame.f_code in _ON_OTHERS:  # other threads', from _install
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
    """Logs what a guard must know of, from any thread: a profiler set by someone else
    (``sys.setprofile``, however it is called), threading's own install of the profiler in a
    thread it starts, a process started, a function's code replaced. The audit hook cannot be
    removed; it reaches the log through its own constants."""
    log: Any = "<the check's log>"  # the log itself, put there by _anchored
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
          and (event == "object.__setattr__" or id(args[0]) in _ANCHORED)):
        log.add("tamper", 0, f"{FORGED} (the code of {args[0].__qualname__} was "
                             + ("replaced)" if event == "object.__setattr__" else "read)"))


class CallsInto:
    """Record every call, made while it is active (this thread and threads it starts), into
    one of the ``targets`` (files, functions or code objects), by identity or by content: a
    helper bound earlier under another name (``from course_utils.profiling import
    step_breakdown``) or an ``exec``'d copy of it is caught as surely as
    ``cu.profiling.step_breakdown``; no module attribute is replaced. ``also(frame)``, when
    given, is called on every Python call while it is active. ``take()`` is the verdict:
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
            codes = _target_codes(target)
            top = getattr(target, "__name__", None) or codes[0].co_name
            for code in codes:
                names.setdefault(code, code.co_name if code.co_name != "<module>" else top)
                if code.co_name not in _ANONYMOUS + ("<module>",):
                    content.setdefault(code_fingerprint(code), names[code])
        # immutable tables; what they were is logged at each start, so a table replaced by
        # another is noticed
        self.files = frozenset(files)
        self.identity = frozenset(names)
        self.content = frozenset(content.items())
        self.quick = frozenset(_quick_key(code) for code in names
                               if code.co_name not in _ANONYMOUS + ("<module>",))
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
        if code.co_name in _ANONYMOUS or _quick_key(code) not in self.quick:
            return None
        return self._copy_of(code)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            if event == "c_call":
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
            self.also(frame)
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
        """A function AutoGraph converted (``tf.function`` tracing), matched through the
        original: AutoGraph names its copy ``tf__<name>`` and runs it with the original's
        globals, where ``<name>`` is the original (a function nested in another is matched
        through the outer one, converted with it)."""
        original = getattr(frame.f_globals.get(frame.f_code.co_name[4:]), "__code__", None)
        found = self.match(original) if isinstance(original, types.CodeType) else None
        return f"{found} (converted by AutoGraph)" if found else None

    def _mark(self, hook: Any, owner: int) -> None:
        """Log where this guard's record starts (again): its tables, its profiler, the frame
        that entered it, and the counts the next verdict compares with (thread states made,
        children)."""
        log: Any = "<the check's log>"  # the log itself, put there by _anchored
        if sys._getframe(1).f_code not in (_ENTER, _TAKE):
            log.add("tamper", id(self), f"{FORGED} (its record was started again by hand)")
            return
        self._logged = set()
        log.add("mark", id(self), id(hook) if hook is not None else 0, self._tables(),
                _probe(), 0, _children(), owner)

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
        _, _, hook, tables, serial, _, children, _ = entries[start]
        window = entries[start + 1:]
        problems = [e[2] for e in window if e[0] == "tamper"]
        called = [e[2] for e in window if e[0] == "call" and e[1] == id(self)]
        seen = self._seen
        changed = (tables != self._tables() or type(self._logged) is not set
                   or set(self._logged) != set(called) or type(seen) is not dict)
        for code, found in list(seen.items()) if not changed else ():
            if found is None and code.co_name not in self.target_names and not (
                    code.co_filename in self.files or _quick_key(code) in self.quick):
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
        if not _children() <= children:
            problems.append(f"{PROCESS} (a child process ran while it was watched)")
        now = _probe()
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
            _unwatch_others(self._hook, self._others)
        sys.setprofile(profile)
        if others and profile is self._hook:
            _watch_others(self._hook, self._others)

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


# AutoGraph (a refusal traced in a tf.function) calls the guard's methods as they are: a
# converted copy, made from their source, would lose the log held in their constants
for _method in vars(CallsInto).values():
    _method = getattr(_method, "fget", _method)
    if isinstance(_method, types.FunctionType):
        _method.autograph_info__ = {}  # tensorflow/python/autograph/impl/api.py
_INSTALL = CallsInto._install.__code__
_ON_OTHERS = (_watch_others.__code__, _unwatch_others.__code__)
_ENTER = CallsInto.__enter__.__code__
_TAKE = CallsInto.take.__code__
for _function in (_start_of, _audit, CallsInto._note, CallsInto._mark, CallsInto._active,
                  CallsInto._verdict, CallsInto.__exit__):
    _anchored(_function, _LOG)
os.register_at_fork(after_in_child=_LOG.after_fork)
del _function, _method, _LOG  # from now on only the functions' constants hold the log
_WITH = (CallsInto.__exit__.__code__, _TAKE)  # __exit__'s code as anchored
_PACKAGE = (str(Path(__file__).parents[2]), str(Path(__file__).resolve().parents[2]))
sys.addaudithook(_audit)
