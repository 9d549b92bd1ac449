"""The check framework: run cases against a learner's function, compare, explain, detect stubs.

A check (see ``checks/lesson_NN.py``) builds a few cases from fresh random inputs with their
expected results from a reference, then calls :func:`run_check`. The framework:

* calls the learner's function on every case and compares its result with the expected one
  (numbers with a tolerance, sequences and mappings element by element, arrays by shape and
  value), turning the learner's result into plain values first so that an object with a
  doctored ``__eq__`` gains nothing;
* on success prints one pass line; on a difference raises :class:`AssertionError` naming the
  case, the expected and the received value, and a hint;
* on a stub (the function raises ``NotImplementedError`` itself) prints "not attempted yet" and
  returns, so an unsolved exercise notebook runs top to bottom; in strict mode (graders, tests)
  it raises :class:`NotAttemptedError` instead, which the grader scores as "not attempted".

Strict mode is on when :func:`set_strict` says so, else when the environment variable
``COURSE_STRICT_CHECKS`` is ``1``/``true``/``yes``.

A check writes nothing to stderr (:func:`stderr_to_stdout`): nbgrader scores a test cell 0
when it does, and TensorFlow's warnings go there.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pickle
import random
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.grading.frame_reach import watching
from course_utils.grading.library_watch import bindings, refuse_reached
from course_utils.quiet import native_stderr_silenced

__all__ = ["PASS_MARK", "STRICT_ENV", "TODO_MARK", "Case", "NotAttemptedError", "compare",
           "expect_function", "fresh_rng", "not_attempted", "run_check", "set_strict",
           "stderr_to_stdout", "strict_checks", "strict_mode"]

#: Environment variable that turns strict mode on (``1``, ``true`` or ``yes``).
STRICT_ENV = "COURSE_STRICT_CHECKS"
#: Printed in front of a passed check, and in front of a not-attempted one.
PASS_MARK = "✅"
TODO_MARK = "⏳"

_strict_override: bool | None = None


class NotAttemptedError(AssertionError):
    """Raised in strict mode by a check whose exercise still holds its stub."""


def set_strict(value: bool | None) -> None:
    """Force strict mode on or off for this process; ``None`` goes back to the environment."""
    global _strict_override
    _strict_override = value


def strict_mode() -> bool:
    """Whether a not-attempted exercise makes its check raise."""
    if _strict_override is not None:
        return _strict_override
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


@contextlib.contextmanager
def strict_checks(value: bool = True) -> Iterator[None]:
    """Context manager: strict mode on (or off) inside the block, restored after it."""
    global _strict_override
    saved = _strict_override
    _strict_override = value
    try:
        yield
    finally:
        _strict_override = saved


@contextlib.contextmanager
def stderr_to_stdout() -> Iterator[None]:
    """Inside the block, Python's stderr (warnings, logs) goes to stdout and native stderr nowhere.

    nbgrader gives a test cell 0 points when it writes to stderr; TensorFlow writes its C++
    notices to file descriptor 2 and Keras its warnings to ``sys.stderr``.
    """
    with native_stderr_silenced(), contextlib.redirect_stderr(sys.stdout):
        yield


def fresh_rng() -> random.Random:
    """A random generator seeded from the operating system, untouched by the notebook's seeds.

    An earlier cell that replaced ``os.urandom`` or a method of ``random.Random`` (to make the
    cases predictable, fresh read nb33-0304) fails the check instead."""
    urandom, generator = os.urandom, random.Random
    methods = [v for v in vars(generator).values() if isinstance(v, types.FunctionType)]
    if (getattr(urandom, "__self__", None) is not sys.modules.get(os.name)
            or getattr(urandom, "__name__", "") != "urandom"
            or any(m.__code__.co_filename != random.__file__ for m in methods)):
        raise AssertionError(
            "os.urandom or random.Random was replaced: the check draws its cases from them. "
            "Restart the kernel and run the notebook without that change.")
    return generator(int.from_bytes(urandom(8), "little"))


@dataclass
class Case:
    """One call of the learner's function: its arguments, the expected result and a label.

    ``verify``, when given, replaces the comparison: it receives the learner's result and
    returns ``None`` when it is right, else a sentence saying what is wrong.
    """

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    expected: Any = None
    label: str = ""
    verify: Callable[[Any], str | None] | None = None
    #: Exceptions the case asks for: one raised is handed to ``verify`` as the result.
    raises: type[BaseException] | tuple[type[BaseException], ...] = ()

    def describe(self) -> str:
        """The call as a learner would type it, e.g. ``(32, 4)`` or the label."""
        if self.label:
            return self.label
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return "(" + ", ".join(parts) + ")"


def _is_stub_raise(fn: Callable[..., Any], error: BaseException) -> bool:
    """True when ``NotImplementedError`` was raised by ``fn``'s own body (the exercise stub)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)  # a check's wrapper
    if code is None:  # a class or callable object: trust the exception
        return True
    tb = error.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and last.tb_frame.f_code is code


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    """Tensors and NumPy scalars as plain Python/NumPy values (``.numpy()``, ``.item()``)."""
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(
        value, "shape", None
    ) == ():
        value = value.item()
    return value


def compare(expected: Any, got: Any, *, rtol: float = 1e-6, atol: float = 1e-9,
            where: str = "result") -> str | None:
    """``None`` when ``got`` matches ``expected``, else a sentence saying where they differ.

    Integers must be integers (``True`` is not ``1``), floats match within ``rtol``/``atol``,
    strings exactly, lists and tuples element by element, mappings key by key, NumPy arrays by
    shape and values.
    """
    got = _plain(got)
    if isinstance(expected, bool):
        if type(got) is not bool and type(_plain(got)) is not bool:
            return f"{where} should be a bool, got {type(got).__name__}"
        return None if bool(got) == expected else f"{where} should be {expected}"
    if isinstance(expected, int):
        if isinstance(got, bool) or not isinstance(got, int):
            if isinstance(got, float) and got.is_integer():
                return f"{where} should be an int, got the float {got!r} (use // or int())"
            return f"{where} should be an int, got {type(got).__name__}"
        value = int.__int__(got)
        return None if value == expected else f"{where} is off by {value - expected}"
    if isinstance(expected, float):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{where} should be a number, got {type(got).__name__}"
        value = float.__float__(got) if isinstance(got, float) else float(int.__int__(got))
        if math.isnan(expected) and math.isnan(value):
            return None
        if math.isclose(value, expected, rel_tol=rtol, abs_tol=atol):
            return None
        ratio = f" ({value / expected:.3g}× the expected value)" if expected else ""
        return f"{where} differs{ratio}"
    if isinstance(expected, str):
        if not isinstance(got, str):
            return f"{where} should be a str, got {type(got).__name__}"
        return None if str.__str__(got) == expected else f"{where} differs"
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            return f"{where} should be a mapping, got {type(got).__name__}"
        if set(got) != set(expected):
            missing = sorted(map(str, set(expected) - set(got)))
            extra = sorted(map(str, set(got) - set(expected)))
            return f"{where} keys differ (missing {missing}, unexpected {extra})"
        for key in expected:
            reason = compare(expected[key], got[key], rtol=rtol, atol=atol,
                             where=f"{where}[{key!r}]")
            if reason:
                return reason
        return None
    if isinstance(expected, (list, tuple)):
        is_array = type(got).__module__ == "numpy" and hasattr(got, "shape")
        if isinstance(got, (str, bytes)) or not (isinstance(got, Sequence) or is_array):
            return f"{where} should be a list, got {type(got).__name__}"
        got_items = list(got)
        if len(got_items) != len(expected):
            return f"{where} should have {len(expected)} items, got {len(got_items)}"
        for index, (want, have) in enumerate(zip(expected, got_items, strict=True)):
            reason = compare(want, have, rtol=rtol, atol=atol, where=f"{where}[{index}]")
            if reason:
                return reason
        return None
    if type(expected).__module__ == "numpy":
        import numpy as np

        have = np.asarray(got)
        if have.shape != expected.shape:
            return f"{where} should have shape {expected.shape}, got {have.shape}"
        if not np.allclose(have, expected, rtol=rtol, atol=atol, equal_nan=True):
            worst = np.unravel_index(np.argmax(np.abs(have - expected)), expected.shape)
            return f"{where} differs most at index {tuple(int(i) for i in worst)}"
        return None
    if expected is None:
        return None if got is None else f"{where} should be None, got {type(got).__name__}"
    return None if got == expected else f"{where} differs"


def not_attempted(name: str) -> None:
    """Report an exercise that still holds its stub: print it, or raise in strict mode."""
    if strict_mode():
        raise NotAttemptedError(f"{name}: not attempted yet")
    print(f"{TODO_MARK} {name}: not attempted yet. Replace `raise NotImplementedError()` "
          "with your code, then run this cell again.")


#: Names by which code reads its callers' frames, the cells of a function's closure or every
#: live object: an answer that uses them can read the expected results out of the check (or a
#: function the check hands it) instead of computing them. A name built at run time escapes
#: this scan; the checks that matter also keep their answers out of reach.
INTROSPECTION_NAMES = frozenset({
    "currentframe", "_getframe", "f_back", "f_locals", "f_globals", "tb_frame",
    "getouterframes", "getframeinfo", "get_objects", "get_referrers", "get_referents",
    "getclosurevars", "settrace", "setprofile", "getprofile", "_current_frames", "__closure__",
    "cell_contents", "getnamespace", "func_dump", "serialize_keras_object", "getargvalues"})


def _course_home(fn: Any) -> str:
    """``module.name`` when ``fn`` (or what a ``functools.partial`` wraps) is a function that
    the course's package defines under that name (a helper or a reference answer); a check's
    own wrappers around the learner's function are not module attributes and pass."""
    while hasattr(fn, "func") and callable(fn.func):  # functools.partial and friends
        fn = fn.func
    module = str(getattr(fn, "__module__", "") or "")
    if module != "course_utils" and not module.startswith("course_utils."):
        return ""
    owner: Any = sys.modules.get(module)
    for part in str(getattr(fn, "__qualname__", "")).split("."):
        owner = getattr(owner, part, None)
    return f"{module}.{fn.__qualname__}" if owner is fn else ""


def _installed(filename: str) -> bool:
    """Whether code from ``filename`` is Python's own or an installed package's (not the
    learner's: a notebook cell or a module of their own)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return any(filename.startswith(str(Path(prefix).resolve())) or filename.startswith(prefix)
               for prefix in prefixes)


def _called_globals(current: Any, code: types.CodeType) -> list[Any]:
    """The learner's own functions (and the functions of the learner's own modules) that
    ``code`` names in ``current``'s globals: a helper defined beside the answer is scanned as
    the answer is."""
    namespace = getattr(current, "__globals__", None)
    if not isinstance(namespace, dict):
        return []
    reached = []
    for name in code.co_names:
        value = namespace.get(name)
        values = [value]
        if isinstance(value, types.ModuleType):  # helper_module.peek(): the module's functions
            values = [getattr(value, attr, None) for attr in code.co_names]
        for each in values:
            each_code = getattr(each, "__code__", None)
            if isinstance(each_code, types.CodeType) and not _installed(each_code.co_filename):
                reached.append(each)
    return reached


def _strings(constants: Any) -> set[str]:
    """The strings among a code object's constants, within tuples and frozensets too."""
    found: set[str] = set()
    for constant in constants:
        if isinstance(constant, str):
            found.add(constant)
        elif isinstance(constant, (tuple, frozenset)):
            found |= _strings(constant)
    return found


def grader_introspection(fn: Any, *, constants: bool = False,
                         also: frozenset[str] = frozenset()) -> list[str]:
    """The frame- and object-walking names the learner's code in ``fn`` uses: its nested
    functions, the functions its closure holds and the learner's own functions it calls by a
    global name, not the course's own (a check's wrapper). With ``constants``, also those its
    string constants name (``getattr(fn, "__closure__")``, ``"_get" + "frame"`` folded by the
    compiler): for a check whose audit lives in the closures of what it hands over. ``also``:
    more names a check refuses (the names of what it hands over)."""
    names = INTROSPECTION_NAMES | also
    package = str(Path(__file__).resolve().parent.parent)
    found: set[str] = set()
    functions, seen = [fn], set()
    while functions:
        current = functions.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        code = getattr(current, "__code__", None) or getattr(type(current).__call__,
                                                             "__code__", None)
        if not isinstance(code, types.CodeType):
            continue
        if not str(code.co_filename).startswith(package):
            codes = [code]
            while codes:
                each = codes.pop()
                found |= names & set(each.co_names)
                if constants:
                    found |= names & _strings(each.co_consts)
                codes.extend(c for c in each.co_consts if isinstance(c, types.CodeType))
                functions.extend(_called_globals(current, each))
        for cell in getattr(current, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value):
                functions.append(value)
        wrapped = getattr(current, "__wrapped__", None) or getattr(current, "func", None)
        if callable(wrapped):
            functions.append(wrapped)
    return sorted(found)


def refuse_peeks(name: str, fn: Any, *, constants: bool = False) -> None:
    """Raise an ``AssertionError`` when ``fn``'s code names a frame or closure reader
    (:func:`grader_introspection`; with ``constants``, in its string constants too)."""
    peeks = grader_introspection(fn, constants=constants) if callable(fn) else []
    if peeks:
        raise AssertionError(
            f"{name}: your function uses {', '.join(peeks)}, which reads the checker's own "
            "frames or objects (where the expected answers are) instead of computing the "
            "answer. Compute it from the arguments you are given.")


def expect_function(name: str, fn: Any) -> None:
    """Raise an ``AssertionError`` that says so when ``fn`` is not the learner's function."""
    if isinstance(fn, types.ModuleType) or not callable(fn):
        raise AssertionError(f"{name}: expected your function, got {_short(fn)}. "
                             f"Pass the function itself, e.g. check_{name}({name}).")


def run_check(name: str, fn: Any, cases: Iterable[Case], *, hint: str = "",
              rtol: float = 1e-6, atol: float = 1e-9) -> bool:
    """Call ``fn`` on every case and compare with the expected results.

    Returns ``True`` when every case passed (after printing one pass line) and ``False`` when
    the exercise is not attempted yet (outside strict mode). Raises :class:`AssertionError`
    at the first case that differs, with the case, expected and received values and ``hint``.
    """
    expect_function(name, fn)
    home = _course_home(fn)
    if home:
        raise AssertionError(
            f"{name}: the function you passed is {home}, the course's own code, not yours. "
            "Write the function yourself (the course's helpers may be called inside it only "
            "where the exercise says so).")
    refuse_peeks(name, fn)
    # what judges each case, taken before the answer first runs: an answer that reaches the
    # cases (through its callers' frames) and rewrites what judges them is named below
    plan = tuple((case, case.verify, case.expected, case.raises, _digest(case.expected))
                 for case in cases)
    hint_text = f"\nHint: {hint}" if hint else ""
    libraries = bindings()  # Python's, NumPy's, TensorFlow's functions now
    with watching() as reached:  # frames the answer reads, however it names them
        for number, (case, verify, expected, raises, digest) in enumerate(plan, start=1):
            refuse_reached(name, number, reached, libraries)  # what an earlier cell set
            try:
                got = fn(*case.args, **case.kwargs)
            except NotImplementedError as error:
                if _is_stub_raise(fn, error):
                    not_attempted(name)
                    return False
                raise AssertionError(
                    f"{name}: case {number} {case.describe()} raised NotImplementedError from "
                    f"inside a library call: {error}{hint_text}") from error
            except Exception as error:
                if not (raises and isinstance(error, raises)):
                    raise AssertionError(
                        f"{name}: case {number} {case.describe()} raised "
                        f"{type(error).__name__}: {error}{hint_text}") from error
                got = error  # the exception the case asks for: its verify judges it
            refuse_reached(name, number, reached, libraries)
            if (case.verify is not verify or case.expected is not expected
                    or case.raises is not raises or _digest(expected) != digest):
                raise AssertionError(
                    f"{name}: case {number}: your function changed the check's own case (what "
                    "judges it, or the expected result) while it ran. Compute the answer; do not "
                    "change the code that judges it.")
            if verify is not None:
                reason = verify(got)
                if reason:
                    raise AssertionError(f"{name}: case {number} {case.describe()}: {reason}"
                                         f"{hint_text}")
                refuse_reached(name, number, reached, libraries)  # learner code verify ran
                continue
            reason = compare(expected, got, rtol=rtol, atol=atol)
            if reason:
                raise AssertionError(
                    f"{name}: case {number} {case.describe()}: {reason}.\n"
                    f"  expected: {_short(expected)}\n  got:      {_short(got)}{hint_text}")
    print(f"{PASS_MARK} {name}: {len(plan)} case{'s' if len(plan) != 1 else ''} passed")
    return True


def _digest(value: Any) -> bytes:
    """A fingerprint of ``value`` (its pickle, else its repr): an expected result changed in
    place no longer matches the one taken before the answer ran."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a value that cannot be pickled: its repr
        data = repr(value).encode()
    return hashlib.sha256(data).digest()
