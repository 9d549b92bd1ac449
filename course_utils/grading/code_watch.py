"""The course's code kept as it was while a learner's function runs inside a check.

An answer runs in the same Python process as the check that judges it, so it could replace a
judge while it runs: ``import course_utils.grading.checks.dataset_graphs as dg; dg.runs_python =
lambda graph: False`` inside the learner's function passes a dataset that calls Python, and the
grader's fresh import of ``course_utils.grading`` before each check cell cannot help, because
the replacement happens during the check. :func:`course_code_kept` records every function, class
and constant of the loaded ``course_utils`` modules (the module's name bound to them, a
function's code and defaults, a class's own names and methods; a number, string or tuple a
module binds, such as a threshold) before the learner's code runs; after it, whatever was
rebound, recoded or deleted is put back and the check fails, naming it. Names added are not
changes (the course imports lazily); a module first imported while the block runs (a check's
lazy import of its judge) is compared with its source at the end instead, and dropped from
``sys.modules`` when it differs, so that the next use imports it afresh. What lies outside
``course_utils`` (NumPy, TensorFlow, Python's built-ins) is not watched: patching Python itself
is never protected.

What an earlier cell replaced is in place before the snapshot: the grader imports
``course_utils.grading`` afresh before each check, but not the rest of the course (its state,
the learner's strategies and devices, lives there). :func:`replaced_before` compares that rest
with its source instead: each function, class and method a module's source defines must be
the module's own (its code from that file), each constant it assigns a literal must have that
value. Code from the repository's ``tests/`` is trusted (the tests patch the course on purpose).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from course_utils.grading.frame_reach import code_key as _code_key
from course_utils.grading.frame_reach import learners_file
from course_utils.grading.frame_reach import source_codes as _source_codes

__all__ = ["course_code_kept", "replaced_before"]

_KINDS = (types.FunctionType, type, types.ModuleType)
#: Constants watched too (a threshold raised passes anything), compared by value.
_VALUES = (int, float, complex, str, bytes, bool, type(None))
MEMBERS = "(its members)"  # the part that holds the names a class of the course defines


_GONE = object()  # a binding deleted


def _function_parts(fn: types.FunctionType) -> tuple[Any, ...]:
    return fn.__code__, fn.__defaults__, fn.__kwdefaults__


def _snapshot() -> dict[tuple[str, str, str], Any]:
    """``(module, name, part) -> object`` for every function, class and constant bound in a
    loaded ``course_utils`` module: the binding, a function's code and defaults, and a class's
    own names and the functions it defines itself (where it is defined)."""
    kept: dict[tuple[str, str, str], Any] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "course_utils"
                                  or module_name.startswith("course_utils.")):
            continue
        for name, value in list(vars(module).items()):
            if type(value) in _VALUES or isinstance(value, (tuple, frozenset)):
                kept[module_name, name, ""] = value
                continue
            if not isinstance(value, _KINDS):
                continue
            kept[module_name, name, ""] = value
            if getattr(value, "__module__", None) != module_name:
                continue  # imported: watched where it is defined
            if isinstance(value, types.FunctionType):
                kept[module_name, name, "code"] = _function_parts(value)
            elif isinstance(value, type):
                members = vars(value)
                kept[module_name, name, MEMBERS] = frozenset(members)
                for attribute, member in list(members.items()):
                    if isinstance(member, types.FunctionType):
                        kept[module_name, name, attribute] = (member, *_function_parts(member))
    return kept


def _same(now: Any, then: Any) -> bool:
    """The same objects (tuples compared item by item, by identity: no ``__eq__`` runs)."""
    if isinstance(then, frozenset) and isinstance(now, frozenset):  # a class's names (str)
        return now == then
    if type(then) in _VALUES:
        return type(now) is type(then) and (now == then or now != now and then != then)
    if isinstance(then, tuple) and isinstance(now, tuple):
        return len(now) == len(then) and all(a is b for a, b in zip(now, then, strict=True))
    return now is then


def _put_back(changed: list[tuple[str, str, str]], kept: dict[tuple[str, str, str], Any],
              modules: dict[str, Any]) -> None:
    """Restore every changed binding, code, defaults and method of ``kept``."""
    for module_name, name, part in changed:
        module, original = modules[module_name], kept[module_name, name, ""]
        if part == "":
            setattr(module, name, original)
        elif part == MEMBERS:
            for added in set(vars(original)) - kept[module_name, name, part]:
                delattr(original, added)
        elif part == "code":
            original.__code__, original.__defaults__, original.__kwdefaults__ = (
                kept[module_name, name, part])
        else:
            member, code, defaults, kwdefaults = kept[module_name, name, part]
            member.__code__, member.__defaults__, member.__kwdefaults__ = (
                code, defaults, kwdefaults)
            setattr(original, part, member)


@contextlib.contextmanager
def course_code_kept(check: str) -> Iterator[None]:
    """Run the block (the learner's code inside check ``check``); afterwards, put back any
    function or class of the course it replaced and fail, naming what it replaced."""
    snapshot, put_back, same = _snapshot, _put_back, _same  # bound now: the block may rebind
    kept = snapshot()
    modules = {module_name: sys.modules[module_name] for module_name, _, _ in kept}
    written: list[str] = []  # names the learner's code bound in a course module, even undone
    watched = _watch_writes(modules, kept, written)
    finished = False
    try:
        yield
        finished = True
    finally:
        for module in watched:
            object.__setattr__(module, "__class__", types.ModuleType)
        now = snapshot()
        changed = sorted(key for key, value in kept.items()
                         if key not in now or not same(now[key], value))
        # a module first imported inside the block (a check's lazy import): compared with
        # its source, and dropped so that the next use imports it afresh
        late = [(name, module) for name, module in list(sys.modules.items())
                if name not in modules and module is not None
                and (name == "course_utils" or name.startswith("course_utils."))]
        late_changed = [found for name, module in late for found in _replaced_in(name, module)]
        for name, module in late:
            if _replaced_in(name, module):
                _forget(name, module)
        late_changed += [name for name in dict.fromkeys(written)
                         if not any(f"{m}.{n}" == name for m, n, _ in changed)]
        if changed or late_changed:
            put_back(changed, kept, modules)
            rebound = {(m, n) for m, n, p in changed if p == ""}
            named = [f"{m}.{n}" + ("" if p == "" else f" {p}" if p == MEMBERS
                                   else " (its code)" if p == "code" else f".{p}")
                     for m, n, p in changed if p == "" or (m, n) not in rebound] + late_changed
            names = ", ".join(named[:4])
            more = f" and {len(named) - 4} more" if len(named) > 4 else ""
            raise AssertionError(
                f"{check}: your code replaced the course's own {names}{more} while the check "
                "ran (put back now, or imported afresh next time). Compute the answer; do not "
                "change the code that judges it."
                + (" Any ✅ line above does not count." if finished else ""))


_PACKAGE = Path(__file__).resolve().parents[1]  # course_utils/
_TESTS = _PACKAGE.parent / "tests"  # the repository's tests patch the course on purpose
_LITERALS = (int, float, complex, str, bytes, bool, type(None), tuple)


@functools.cache
def _defined(file: str) -> tuple[frozenset[str], dict[str, frozenset[str]], dict[str, Any]]:
    """What a module's source defines at its top level: the names of its functions and
    classes, each class's own function names, and its constants (``NAME = <literal>``, not
    ``None``); a name the module itself rebinds (``global``) is its state, not a definition."""
    tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    names, members, constants = set(), {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = frozenset(n.name for n in node.body if isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if value is not None and len(targets) == 1 and isinstance(targets[0], ast.Name):
            with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError):
                constants[targets[0].id] = ast.literal_eval(value)
    rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global)
               for name in node.names}  # the module's own run-time state (a cache)
    constants = {k: v for k, v in constants.items() if k not in rebound and v is not None}
    return frozenset(names - rebound), members, constants


@functools.lru_cache(maxsize=4096)
def _resolved(file: str) -> Path:
    """``file`` resolved (cached: a check resolves the same few hundred files each time)."""
    return Path(file).resolve()


@functools.lru_cache(maxsize=4096)
def _in_tests(file: str) -> bool:
    return _resolved(file).is_relative_to(_TESTS)


_FROM_SOURCE: dict[int, tuple[types.CodeType, bool]] = {}


def _foreign(value: Any, module: types.ModuleType) -> bool:
    """Whether ``value``, bound where ``module``'s source defines it, is another object than
    the module's own: code from elsewhere (a notebook cell, another module's function)."""
    value = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
    with contextlib.suppress(ValueError):
        value = inspect.unwrap(value)
    code = getattr(value, "__code__", None)
    home = code.co_filename if isinstance(code, types.CodeType) else getattr(
        sys.modules.get(getattr(value, "__module__", None) or ""), "__file__", None)
    if isinstance(home, str) and home and _in_tests(home):
        return False
    if isinstance(code, types.CodeType):
        if _resolved(code.co_filename) != _resolved(module.__file__):
            return True
        judged = _FROM_SOURCE.get(id(code))  # the code object kept: its id is not reused
        if judged is None or judged[0] is not code:
            keys = _source_codes(code.co_filename)
            judged = _FROM_SOURCE[id(code)] = (code, keys is None or _code_key(code) in keys)
        return not judged[1]
    return getattr(value, "__module__", None) != module.__name__


def _watch_writes(modules: dict[str, Any], kept: dict[tuple[str, str, str], Any],
                  written: list[str]) -> list[Any]:
    """Give each plain course module a class that notes every binding of the snapshot that
    the learner's code replaces or deletes while the block runs, even one put back before the
    end (``L.THRESHOLD = 0``, then the old value); names added are not changes, and writes
    through the module's ``__dict__`` are not seen. The modules watched."""
    def note(module: Any, name: str, value: Any) -> None:
        key = (module.__name__, name, "")
        if (key in kept and learners_file(sys._getframe(2).f_code.co_filename)
                and (value is _GONE or not _same(value, kept[key]))):
            written.append(f"{module.__name__}.{name}")

    class Watched(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            note(self, name, value)
            super().__setattr__(name, value)

        def __delattr__(self, name: str) -> None:
            note(self, name, _GONE)
            super().__delattr__(name)

    watched = [module for module in modules.values() if type(module) is types.ModuleType]
    for module in watched:
        module.__class__ = Watched
    return watched


def _forget(name: str, module: Any) -> None:
    """Drop ``module`` from ``sys.modules`` and from its package's names: the next import of
    ``name`` makes it afresh from its source (a name added then, not a change)."""
    sys.modules.pop(name, None)
    package, _, short = name.rpartition(".")
    if getattr(sys.modules.get(package), short, None) is module:
        delattr(sys.modules[package], short)


def replaced_before() -> list[str]:
    """The course's functions, methods and constants outside ``course_utils.grading`` (which
    the grader imports afresh) that differ from what their module's source defines: what an
    earlier cell replaced, which :func:`course_code_kept` (a snapshot taken as a check starts)
    cannot tell from the original."""
    found = []
    for name, module in list(sys.modules.items()):
        if (name == "course_utils" or name.startswith("course_utils.")) and not name.startswith(
                "course_utils.grading"):
            found += _replaced_in(name, module)
    return found


def _replaced_in(name: str, module: Any) -> list[str]:
    """What of ``module``'s functions, methods and constants differs from its source."""
    file = getattr(module, "__file__", None) or ""
    if not file.endswith(".py"):
        return []
    found = []
    names, members, constants = _defined(file)
    bound = vars(module)
    for attribute in sorted(names & set(bound)):
        value = bound[attribute]
        if _foreign(value, module):
            found.append(f"{name}.{attribute}")
        elif isinstance(value, type) and attribute in members:
            found += [f"{name}.{attribute}.{m}" for m in sorted(members[attribute])
                      if m in vars(value) and _foreign(vars(value)[m], module)]
    for attribute, literal in constants.items():
        value = bound.get(attribute, literal)
        if type(literal) in _LITERALS and not (type(value) is type(literal) and (
                value == literal or value != value and literal != literal)):
            found.append(f"{name}.{attribute}")
    return found
