"""Lesson 00's exercise 2, run where it must run: a split into logical devices, in a fresh
TensorFlow.

``run_split_answers`` calls each answer's function several times in a child forked from one
kept process that has imported TensorFlow and nothing else (the course package cannot be
imported there), a fresh child per run;
``split_verdict`` says what a run of the calls ``n, n, n + 1, n`` did wrong, and, where a
second fresh TensorFlow ran an op before calling ``fn(1)`` (``after_an_op``), what that did,
and in a third whose CPU the check split itself (``after_a_split``): a number trusted fails.

The answer runs in the process that writes the report the check reads, so what it can reach
there is limited (``source_problem``, read from its source before it runs; the same limits
hold in the process: built-ins taken out, only ``tensorflow`` importable, ``tf.config``'s
functions compared by identity after every call): ``tf.config`` and ``tf.errors``, Python's
built-ins but those that reach files, frames or modules, no ``_``-named or frame attribute,
no attribute set but on its own functions. An answer that wrote the report itself (into its
pipe, through a file) or replaced ``tf.config.list_logical_devices`` would report what
TensorFlow did not do.
"""

from __future__ import annotations

import ast
import atexit
import collections
import inspect
import json
import os
import select
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

from course_utils.child import run_cpu_only, start_cpu_only
from course_utils.grading.checks.restart_advice import says_restart
from course_utils.grading.checks.worker_scripts import parse_python

__all__ = ["ALLOWED_TF", "DENIED_BUILTINS", "run_split_answers", "run_split_in_fresh_process",
           "run_splits_in_fresh_process", "source_problem", "split_verdict"]

_SPLIT_SCRIPT = """
import json, os, select, signal, sys, time
sys.modules["course_utils"] = None  # the course's helpers cannot be reached here
import tensorflow as tf

import builtins
_DENIED = {DENIED}
_SAFE = {k: v for k, v in vars(builtins).items() if k not in _DENIED}
def _import(name, globals=None, locals=None, fromlist=(), level=0):  # tensorflow only
    if name.split(".")[0] != "tensorflow" or level:
        raise ImportError(f"only tensorflow can be imported here, not {name!r}")
    return __import__(name, globals, locals, fromlist, level)
_SAFE["__import__"] = _import
_CONFIG = {n: getattr(tf.config, n) for n in dir(tf.config) if not n.startswith("_")}

def calls(name, source, counts):  # before TensorFlow made its devices
    namespace = {"tf": tf, "__builtins__": _SAFE}
    exec(source, namespace)
    list_logical = _CONFIG["list_logical_devices"]
    results = []
    for count in counts:
        if count == "op":  # TensorFlow runs an op: it makes its devices (one CPU)
            results.append({"op": int((tf.constant(1) + 1).numpy())})
            continue
        if isinstance(count, dict):  # the check splits the CPU itself, then lists (makes) them
            _CONFIG["set_logical_device_configuration"](
                _CONFIG["list_physical_devices"]("CPU")[0],
                [_CONFIG["LogicalDeviceConfiguration"]()] * count["split"])
            results.append({"split": len(list_logical("CPU"))})
            continue
        try:
            names = namespace[name](count)
            changed = sorted(n for n, f in _CONFIG.items() if getattr(tf.config, n, None) is not f)
            if changed:  # tf.config's functions replaced: its answers are not TensorFlow's
                raise LookupError(f"tf.config.{changed[0]} was replaced")
            devices = [d.name for d in list_logical("CPU")]
            results.append({"returned": [str(n) for n in names], "devices": devices,
                            "asked": count})
        except Exception as error:
            results.append({"error": f"{type(error).__name__}: {error}",
                            "runtime_error": isinstance(error, RuntimeError), "asked": count})
    return results

def failed(message):
    return json.dumps([{"error": message, "runtime_error": False}])

def forked(job, timeout):  # one job in a child forked before any device exists
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the jobs' pipe is not the answer's
        os.dup2(2, 1)  # what the answer prints stays out of the results
        try:
            line = json.dumps(calls(*job))
        except BaseException as error:
            line = failed(f"{type(error).__name__}: {error}")
        data = line.encode()
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    data, deadline = b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read_end], [], [], left)[0]:
            os.kill(child, signal.SIGKILL)
            data = failed(f"the calls did not end within {timeout:.0f} s").encode()
            break
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    os.waitpid(child, 0)
    return data.decode() or failed("the call ended the process")

if sys.argv[1] == "once":  # this process is fresh: no fork (Windows has none)
    result = os.dup(1)  # the result's own copy of stdout; what the answer prints: stderr
    os.dup2(2, 1)
    line = "RESULT " + json.dumps(calls(*json.loads(sys.argv[2]))) + "\\n"
    os.write(result, line.encode())
else:  # one job a line on stdin, each in a fork; ends when stdin closes
    for line in sys.stdin:
        print("RESULT " + forked(json.loads(line), float(sys.argv[2])), flush=True)
"""
#: Seconds one job's calls may take in its fork; TensorFlow starts slowly when the cores are
#: busy, so the process that imports it gets longer.
JOB_TIMEOUT_S, START_TIMEOUT_S = 120.0, 300.0
#: Built-ins the answer's code cannot reach in the fresh process: they read or write what
#: is not the answer's (files, the result pipe, frames, modules) or run code built at run time.
DENIED_BUILTINS = ("open", "exec", "eval", "compile", "globals", "locals", "vars", "dir",
                   "setattr", "delattr", "breakpoint", "input", "help", "exit",
                   "quit", "memoryview", "__loader__", "__spec__")
_SPLIT_SCRIPT = _SPLIT_SCRIPT.replace("{DENIED}", repr(set(DENIED_BUILTINS)))


class _FreshTensorFlow:
    """A process that imported TensorFlow and made no device; each job runs in a child forked
    from it, which meets TensorFlow as a fresh process does. Started on first use and kept:
    one TensorFlow import (about 8 CPU-seconds) for every run of the check in this kernel and
    for every answer of the tests' catalogue. It ends when this process closes its stdin, or
    ends; what the answers print goes to its stderr, whose last lines are kept."""

    _shared: _FreshTensorFlow | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.process = start_cpu_only(["-c", _SPLIT_SCRIPT, "serve", str(JOB_TIMEOUT_S)],
                                      stdin=subprocess.PIPE, bufsize=1)
        self.log: collections.deque[str] = collections.deque(maxlen=20)  # stderr's last lines
        self.reader = threading.Thread(target=self.log.extend, args=(self.process.stderr,),
                                       daemon=True)
        self.reader.start()
        self.started, self.pending = False, b""

    @classmethod
    def shared(cls) -> _FreshTensorFlow:
        server = cls._shared
        if server is None or server.owner != os.getpid() or server.process.poll() is not None:
            server = cls._shared = cls()  # (a forked copy of this process starts its own)
            atexit.register(server.close)
        return server

    def run(self, job: tuple[str, str, list[Any]]) -> list[dict[str, Any]]:
        timeout = JOB_TIMEOUT_S + (60 if self.started else START_TIMEOUT_S)
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            line = self._line(time.monotonic() + timeout)
        except (OSError, TimeoutError):
            self.close()
            raise
        if line is None:
            return [{"error": self._last_error(), "runtime_error": False}]
        self.started = True
        return json.loads(line)

    def _line(self, deadline: float) -> str | None:
        """The next result line (read unbuffered from the pipe), or None when it ended."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending or not self.pending.startswith(b"RESULT "):
            if b"\n" in self.pending:  # a line that is no result (a notice): skip it
                self.pending = self.pending.split(b"\n", 1)[1]
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no fresh TensorFlow answered in time")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line[len(b"RESULT "):].decode()

    def _last_error(self) -> str:
        self.process.wait()
        self.reader.join(timeout=10)
        return _error_line(list(self.log), self.process.returncode)

    def close(self) -> None:
        if self.owner != os.getpid():
            return
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        if _FreshTensorFlow._shared is self:
            _FreshTensorFlow._shared = None


#: Attributes that lead from the answer's objects to the frames (and so the modules) of the
#: process's own code: a generator's frame, a frame's caller, its globals.
FRAME_ATTRIBUTES = frozenset({"gi_frame", "cr_frame", "ag_frame", "gi_code", "f_back",
                              "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame",
                              "tb_next", "cell_contents"})
#: What of TensorFlow the answer may use in the fresh process: the split's API and its errors.
ALLOWED_TF = ("config", "errors")


def source_problem(source: str) -> str | None:
    """What in the answer's ``source`` reaches beyond a split (None when nothing does): the
    fresh process gives it ``tf.config`` and ``tf.errors``, Python's built-ins but
    ``DENIED_BUILTINS``, and no other module; it sets no attribute but on its own functions
    (``f.calls = 1``), and reads no ``_``-named attribute. What it could otherwise reach
    writes the process's report itself (its pipe, a file) or replaces what the report reads
    (``tf.config.list_logical_devices``): that report would not be TensorFlow's."""
    try:
        tree = parse_python(source)
    except SyntaxError as error:
        return f"its source does not parse: {error}"
    roots = {"tf", "tensorflow"}
    own = {node.name for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name != "tensorflow":
                    return f"{where} imports {alias.name}: only tensorflow is there"
                roots.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            if node.level or module[0] != "tensorflow" or not (
                    module[1:2] and module[1] in ALLOWED_TF
                    or all(alias.name in ALLOWED_TF for alias in node.names)):
                names = ", ".join(alias.name for alias in node.names)
                return (f"{where} imports {names} from {node.module}: only tf.config and "
                        "tf.errors are there")
        elif isinstance(node, ast.Attribute) and (node.attr.startswith("_")
                                                  or node.attr in FRAME_ATTRIBUTES):
            return f"{where} reads the attribute {node.attr}: it is not there"
        elif isinstance(node, ast.Name) and node.id in DENIED_BUILTINS + ("__import__",):
            return f"{where} uses {node.id}: that built-in is not there"
        elif isinstance(node, ast.Name) and node.id in ("getattr", "hasattr") and not (
                isinstance(parents.get(node), ast.Call) and parents[node].func is node
                and len(parents[node].args) > 1
                and isinstance(parents[node].args[1], ast.Constant)
                and isinstance(parents[node].args[1].value, str)
                and not parents[node].args[1].value.startswith("_")
                and parents[node].args[1].value not in FRAME_ATTRIBUTES):
            return (f"{where} uses {node.id} with a name built at run time or _-named: "
                    "only a plain attribute name is there")
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in roots and node.attr not in ALLOWED_TF:
            return (f"{where} uses {node.value.id}.{node.attr}: only tf.config and tf.errors "
                    "are there")
        targets = (node.targets if isinstance(node, ast.Assign | ast.Delete) else
                   [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and not (
                        isinstance(part.value, ast.Name) and part.value.id in own):
                    return (f"{where} sets the attribute {part.attr}: only attributes of "
                            "your own functions may be set there")
    for node in ast.walk(tree):  # tf handed on whole: its other modules reachable
        if isinstance(node, ast.Name) and node.id in roots and not isinstance(
                parents.get(node), ast.Attribute):
            return (f"line {node.lineno} uses {node.id} itself: only tf.config and tf.errors "
                    "are there")
    return None


def _run_jobs(answers: list[tuple[str, str]], counts: list[Any]
              ) -> list[list[dict[str, Any]]]:
    """Each answer's calls of ``counts``, each in a fresh TensorFlow: a child of the shared
    process (POSIX), or a process of its own where there is no fork."""
    refused = {index: source_problem(source) for index, (_, source) in enumerate(answers)}
    jobs = [(name, source, counts) for index, (name, source) in enumerate(answers)
            if refused[index] is None]
    if not jobs:
        ran = []
    elif not hasattr(os, "fork"):
        ran = [_run_once(job) for job in jobs]
    else:
        with _FreshTensorFlow._lock:
            server = _FreshTensorFlow.shared()
            ran = [server.run(job) for job in jobs]
    done = iter(ran)
    return [[{"error": f"not run in the fresh process: {refused[index]}",
              "runtime_error": False, "refused": True}]
            if refused[index] else next(done) for index in range(len(answers))]


def _run_once(job: tuple[str, str, list[Any]]) -> list[dict[str, Any]]:
    done = run_cpu_only(["-c", _SPLIT_SCRIPT, "once", json.dumps(job)],
                        timeout=START_TIMEOUT_S)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return [{"error": _error_line(done.stderr.splitlines(), done.returncode),
             "runtime_error": False}]


def _error_line(stderr: list[str], code: int | None) -> str:
    """The last line of ``stderr`` that names an error, else the process's exit code (the
    last line may be one of TensorFlow's start-up notices)."""
    errors = [line.strip() for line in stderr if "Error" in line or "Exception" in line]
    return errors[-1] if errors else f"the process ended with code {code}"


def run_split_answers(answers: list[tuple[str, str]], counts: list[int],
                      after_an_op: int | None = None,
                      only_where: Callable[[list[dict[str, Any]]], bool] | None = None,
                      after_a_split: tuple[int, list[int]] | None = None,
                      ) -> list[list[dict[str, Any]]]:
    """For each ``(name, source)``, call ``name(count)`` per count, in a fresh TensorFlow;
    with ``after_an_op``, then in another fresh TensorFlow run an op and call
    ``name(after_an_op)`` (its results follow: ``{"op": 2}``, then the call's) – for every
    answer, or, with ``only_where``, for those whose first results it accepts (a verdict
    decided by the first calls needs no second TensorFlow); ``after_a_split=(k, asked)``: in a
    third, the check splits the CPU into ``k``, then calls each of ``asked`` (``{"split": k}``).

    One process imports TensorFlow (the course package cannot be imported there) and is kept;
    each run goes in a child forked from it before any device exists (POSIX; where there is no
    fork, one process per run): each meets TensorFlow as a fresh process does. Each call's
    result holds ``returned`` (the names) and ``devices`` (the logical CPUs after the call), or
    ``error`` (its type and message) and ``runtime_error``.
    """
    results = _run_jobs(list(answers), list(counts))
    again = [index for index, first in enumerate(results) if only_where is None
             or only_where(first)]
    later = ([["op", after_an_op]] if after_an_op is not None else []) + (
        [[{"split": after_a_split[0]}, *after_a_split[1]]] if after_a_split else [])
    for job in later:
        after = _run_jobs([answers[index] for index in again], job)
        for index, run in zip(again, after, strict=True):  # a failed process: say which
            run = run if "op" in run[0] or "split" in run[0] else [
                {"op" if job[0] == "op" else "split": None, "error": run[0].get("error")}]
            results[index] = results[index] + run
    return results


def run_splits_in_fresh_process(fn: Any, counts: list[int], **later: Any
                                ) -> list[dict[str, Any]]:
    """Call ``fn(count)`` for each count in turn, in one fresh TensorFlow: what each did (and
    ``after_an_op``, ``only_where``, ``after_a_split``: see :func:`run_split_answers`)."""
    source = textwrap.dedent(inspect.getsource(fn))
    return run_split_answers([(fn.__name__, source)], counts, **later)[0]


def run_split_in_fresh_process(fn: Any, num_devices: int) -> dict[str, Any]:
    """Run ``fn(num_devices)`` in a fresh process: what it returned and made, or its error line."""
    return run_splits_in_fresh_process(fn, [num_devices])[0]


def split_verdict(results: list[dict[str, Any]], count: int) -> str | None:
    """What the calls ``count, count, count + 1, count`` in one process did wrong, or None."""
    expected = [f"/device:CPU:{index}" for index in range(count)]
    labels = [f"the first call split_cpu({count})",
              f"the second call split_cpu({count}) (the set-up cell run again)",
              f"then split_cpu({count + 1}) (another number, too late)",
              f"then split_cpu({count}) once more"]
    if results and results[0].get("refused"):
        return results[0]["error"]
    if len(results) < len(labels):
        return f"in a fresh process it raised: {results[-1]['error']}"
    for index in (0, 1, 3):
        result, label = results[index], labels[index]
        if "error" in result:
            return f"in a fresh process {label} raised: {result['error']}"
        if result["devices"] != expected:
            return f"after {label} expected the logical CPUs {expected}, the process had " \
                   f"{result['devices']}"
        if result["returned"] != expected:
            return f"{label} should return {expected}, it returned {result['returned']}"
    asked_more = results[2]
    if "error" not in asked_more:
        return (f"{labels[2]} returned {asked_more['returned']} without an error: the devices "
                f"are fixed, so asking for {count + 1} must raise, not hand back {count}")
    if not asked_more["runtime_error"]:
        return f"{labels[2]} raised {asked_more['error']!r}: raise a RuntimeError"
    if not says_restart(asked_more["error"]):
        return (f"{labels[2]} raised {asked_more['error']!r}: its message must say what to "
                "do (restart the kernel; not the word alone, nor advice against it)")
    starts = [index for index, result in enumerate(results)  # other fresh processes
              if "op" in result or "split" in result] + [len(results)]
    for start, end in zip(starts, starts[1:], strict=False):
        verdict = _after_a_split_verdict if "split" in results[start] else _after_an_op_verdict
        if problem := verdict(results[start:end]):
            return problem
    return None


def _after_a_split_verdict(results: list[dict[str, Any]]) -> str | None:
    """What the calls did after the check split the CPU itself: its names, or else restart."""
    made = results[0]["split"]
    label = (f"in another fresh process, after the check split the CPU into {made or 'k'} "
             "logical devices itself (as the set-up cell does before your function ever runs)")
    if len(results) < 2 or made is None:
        return f"{label}: the process failed: {results[-1].get('error')}"
    expected = [f"/device:CPU:{index}" for index in range(made)]
    for result in results[1:]:
        asked = result.get("asked")
        call, did = f"{label}, split_cpu({asked})", result.get("returned", result.get("error"))
        if asked == made and did != expected:
            return f"{call} should return {expected} ({made} exist, as asked), it gave {did!r}"
        if asked != made and "error" not in result:
            return (f"{call} returned {result['returned']} without an error: {made} logical "
                    f"CPUs exist, {asked} asked – count the devices that exist, not "
                    "what your function asked for before or a number you expect")
        if asked != made and not (result["runtime_error"] and says_restart(result["error"])):
            return (f"{call} raised {result['error']!r}: raise a RuntimeError that says to "
                    "restart the kernel")
    return None


def _after_an_op_verdict(results: list[dict[str, Any]]) -> str | None:
    """What ``split_cpu(1)`` did after TensorFlow ran an op (its one CPU device made)."""
    label = ("in another fresh process, after TensorFlow had run an op (which made its one "
             "logical CPU), split_cpu(1)")
    if len(results) < 2 or results[0].get("op") is None:
        return f"{label}: the process failed: {results[-1].get('error')}"
    result, expected = results[1], ["/device:CPU:0"]
    if "error" in result:
        return (f"{label} raised {result['error']!r}: TensorFlow refuses the split because "
                "the devices exist, but there is 1, as asked: return their names (only "
                "another number needs a restart)")
    if result["returned"] != expected:
        return f"{label} should return {expected}, it returned {result['returned']}"
    return None
