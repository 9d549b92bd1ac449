"""The checks' guard's parts that are about code (``call_guard``): what a function does
(``code_fingerprint``), a target's code objects, the append-only log the guard keeps its
record in (``Log``), which the guard's functions hold as a constant of their own code
(``anchored``), and the guard's messages (re-exported by ``call_guard``).
"""

from __future__ import annotations

import _thread
import dis
import hashlib
import types
from pathlib import Path
from typing import Any

__all__ = ["ANCHORED", "ANONYMOUS", "FORGED", "HERE", "PROCESS", "RAW_THREAD", "REMOVED",
           "WATCHING", "Log", "anchored", "autograph_original", "code_fingerprint", "quick_key",
           "searches", "target_codes", "watching_problem"]

REMOVED = "your function removed the check's profiler"
RAW_THREAD = ("your function ran Python in a thread the check cannot watch (a thread started "
              "with _thread, or TensorFlow's own threads running a tf.py_function or a "
              "generator)")
PROCESS = "your function started a process, which the check cannot watch"
FORGED = "your function changed the check's record of what it called"
WATCHING = (REMOVED, RAW_THREAD, PROCESS, FORGED)  # what can go wrong with the watching
ANONYMOUS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")
HERE = "<the check's log>"  # replaced, in the functions' constants, by the log itself


class Log(tuple):
    """Append-only: ``(entries, digest, [lock, digests at each start])``, every entry also fed
    to a SHA-256 digest, which cannot be rewound, so a list that was cleared, cut or rewritten
    no longer matches it (``intact``). A tuple without attributes: no part can be swapped for
    another. The guard's functions reach it through their own code constants (``anchored``),
    and reading those (``__code__``), or searching the garbage collector's objects, is an audit
    event the guard logs."""

    __slots__ = ()

    # by identity: a code object that holds it as a constant is hashed and compared
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __new__(cls) -> Log:
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


ANCHORED: set[int] = set()  # the ids of the functions that hold the log


def searches() -> tuple[int, bool]:
    """The garbage collector's searches logged in this process (``call_guard``'s audit hook
    logs each, whoever searched), and whether the log is intact: a check compares both before
    and after the learner's code runs. Anchored to the log by ``call_guard``."""
    log: Any = "<the check's log>"  # the log itself, once anchored (HERE)
    return (sum(e[0] == "tamper" and "garbage collector" in e[2] for e in log.entries),
            log.intact())


def anchored(function: Any, log: Log) -> Any:
    """``function`` with the constant ``HERE`` replaced by the log: what it reads the log
    through is its own code, which only an audited ``__code__`` assignment could replace,
    and an audited ``__code__`` read could reach."""
    code = function.__code__
    function.__code__ = code.replace(co_consts=tuple(
        log if isinstance(c, str) and c == HERE else c for c in code.co_consts))
    ANCHORED.add(id(function))
    return function


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


def quick_key(code: types.CodeType) -> tuple[Any, ...]:
    """A cheap part of the fingerprint: only codes that share it are fingerprinted."""
    return code.co_argcount, code.co_kwonlyargcount, code.co_names


def target_codes(target: Any) -> list[types.CodeType]:
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


def watching_problem(names: list[str]) -> str | None:
    """The first of ``take()``'s names when it says what went wrong with the watching."""
    return names[0] if names and names[0].startswith(WATCHING) else None


def autograph_original(frame: Any) -> types.CodeType | None:
    """The code of the function whose AutoGraph copy (``tf.function`` tracing) ``frame`` runs:
    AutoGraph names its copy ``tf__<name>`` and runs it with the original's globals, where
    ``<name>`` is the original (a function nested in another is matched through the outer
    one, converted with it)."""
    original = getattr(frame.f_globals.get(frame.f_code.co_name[4:]), "__code__", None)
    return original if isinstance(original, types.CodeType) else None
