"""Refusing the course's own answers inside a learner's function (lessons 05 and 06).

A check wraps the learner's function in :func:`refusing`: while it runs, every Python function
it enters is compared with the course's helpers and reference answers, two ways.

* By identity: the helper's code object (or one defined inside it) is entered, whatever name
  it was reached by (an alias bound before the check, a wrapper, a lambda, an import of the
  check module's reference answer).
* By content: a function whose bytecode, names and constants (its docstring aside, and the
  functions defined inside it) equal a helper's. That is what ``exec(inspect.getsource(...))``
  of a helper's module makes, and what pasting the helper under another name with its locals
  renamed makes. Comprehensions and lambdas are compared by identity only: a one-line
  ``[("F", b) for b in range(n)]`` is the same bytecode whoever writes it.

A learner who writes the function themselves produces other bytecode; a copy edited until its
bytecode differs is a rewrite, which the exercises' task variants are there to demand.
"""

from __future__ import annotations

import dis
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["code_fingerprint", "refusing"]

_ANONYMOUS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")
#: Where installed code lives: a learner's copy is never there, so it is not fingerprinted
#: (TensorFlow runs thousands of functions while a step is traced).
_LIBRARIES = tuple({sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
                   | {str(Path(__file__).resolve().parents[2])})


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


def _codes(helpers: Iterable[Any]) -> tuple[dict[Any, str], dict[tuple[Any, ...], str]]:
    """The helpers' code objects by identity (nested ones too), and their fingerprints."""
    by_identity: dict[Any, str] = {}
    by_content: dict[tuple[Any, ...], str] = {}
    for helper in helpers:
        top = helper.__code__
        stack = [top]
        while stack:
            code = stack.pop()
            by_identity[code] = helper.__name__
            if code is top or code.co_name not in _ANONYMOUS:
                by_content[code_fingerprint(code)] = helper.__name__
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return by_identity, by_content


def _raised_by(fn: Any, error: BaseException) -> bool:
    """True when ``error`` was raised by ``fn``'s own body (the exercise stub)."""
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    code = getattr(fn, "__code__", None)
    return code is None or (last is not None and last.tb_frame.f_code is code)


class _Refusing:
    """``fn``, run so that it fails with ``why`` if it runs (a copy of) one of the helpers.

    Has no ``__code__``, so the framework trusts its NotImplementedError: only the learner's
    own stub raise is let through as one.
    """

    def __init__(self, fn: Any, helpers: Iterable[Any], why: str,
                 also: Callable[[Any], None] | None = None) -> None:
        self.fn, self.why, self.also = fn, why, also
        self.by_identity, self.by_content = _codes(helpers)
        self.__wrapped__ = fn  # the framework's introspection guard reads the learner's code

    def _match(self, code: types.CodeType, seen: dict[Any, str | None]) -> str | None:
        if code in seen:
            return seen[code]
        name = self.by_identity.get(code)
        if name:
            found: str | None = name
        elif code.co_name in _ANONYMOUS or code.co_filename.startswith(_LIBRARIES):
            found = None
        else:
            copied = self.by_content.get(code_fingerprint(code))
            found = f"{copied} (a copy of it)" if copied else None
        seen[code] = found
        return found

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entered: list[str] = []
        seen: dict[Any, str | None] = {}

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event != "call":
                return
            if self.also is not None:
                self.also(frame)
            if not entered:
                name = self._match(frame.f_code, seen)
                if name:
                    entered.append(name)

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            result = self.fn(*args, **kwargs)
        except NotImplementedError as error:
            if _raised_by(self.fn, error):
                raise
            raise RuntimeError(f"NotImplementedError from inside a library call: {error}"
                               ) from error
        finally:
            sys.setprofile(previous)
        if entered:
            raise AssertionError(f"your function ran the course's {entered[0]}: {self.why}")
        return result


def refusing(fn: Any, helpers: Iterable[Any], why: str,
             also: Callable[[Any], None] | None = None) -> Any:
    """``fn`` refusing the helpers' code (see the module's docstring); ``also(frame)`` is called
    on every Python call while it runs. Non-callables are returned as they are."""
    return _Refusing(fn, helpers, why, also) if callable(fn) else fn
