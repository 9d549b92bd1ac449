"""Lesson 00's exercise 2, run where it must run: a split into logical devices, in a fresh
TensorFlow.

``run_split_answers`` calls each answer's function several times in one process that has
imported TensorFlow and nothing else (the course package cannot be imported there);
``split_verdict`` says what a run of the calls ``n, n, n + 1, n`` did wrong, and, where a
second fresh TensorFlow ran an op before calling ``fn(1)`` (``after_an_op``), what that did.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from typing import Any

from course_utils.child import run_cpu_only

__all__ = ["run_split_answers", "run_split_in_fresh_process", "run_splits_in_fresh_process",
           "split_verdict"]

_SPLIT_SCRIPT = """
import json, os, sys
sys.modules["course_utils"] = None  # the course's helpers cannot be reached here
import tensorflow as tf

def calls(name, source, counts):  # before TensorFlow made its devices
    namespace = {{"tf": tf}}
    exec(source, namespace)
    results = []
    for count in counts:
        if count == "op":  # TensorFlow runs an op: it makes its devices (one CPU)
            results.append({{"op": int((tf.constant(1) + 1).numpy())}})
            continue
        try:
            names = namespace[name](count)
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            results.append({{"returned": [str(n) for n in names], "devices": devices}})
        except Exception as error:
            results.append({{"error": f"{{type(error).__name__}}: {{error}}",
                             "runtime_error": isinstance(error, RuntimeError)}})
    return results

jobs = [(name, source, counts) for name, source in {answers!r} for counts in {sequences!r}]
if len(jobs) == 1:  # this process is fresh: no fork (Windows has none)
    print("RESULT " + json.dumps(calls(*jobs[0])))
for name, source, counts in jobs if len(jobs) > 1 else []:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            line = json.dumps(calls(name, source, counts))
        except BaseException as error:
            line = json.dumps([{{"error": f"{{type(error).__name__}}: {{error}}",
                                 "runtime_error": False}}])
        os.write(write_end, line.encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    os.waitpid(child, 0)
    print("RESULT " + (data.decode() or json.dumps([{{"error": "the call ended the process",
                                                       "runtime_error": False}}])))
"""


def _run_jobs(answers: list[tuple[str, str]], sequences: list[list[Any]]
              ) -> list[list[dict[str, Any]]]:
    """One process: each answer's calls per sequence, each (answer, sequence) in a fresh
    TensorFlow (a child forked before any device exists, unless there is only one)."""
    script = _SPLIT_SCRIPT.format(answers=list(answers), sequences=sequences)
    done = run_cpu_only(["-c", script], timeout=300)  # TensorFlow starts slowly when busy
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]
    jobs = len(answers) * len(sequences)
    if len(results) < jobs:
        error = done.stderr.strip().splitlines()
        line = error[-1] if error else f"the process ended with code {done.returncode}"
        results += [[{"error": line, "runtime_error": False}]] * (jobs - len(results))
    return results


def run_split_answers(answers: list[tuple[str, str]], counts: list[int],
                      after_an_op: int | None = None) -> list[list[dict[str, Any]]]:
    """For each ``(name, source)``, call ``name(count)`` per count, in a fresh TensorFlow;
    with ``after_an_op``, then in another fresh TensorFlow run an op and call
    ``name(after_an_op)`` (its results follow: ``{"op": 2}``, then the call's).

    One process imports TensorFlow (the course package cannot be imported there); a single
    run goes in it, several each in a child forked before any device exists (POSIX only; where
    there is no fork, one process per run): each meets TensorFlow as a fresh process does.
    Each call's result holds ``returned`` (the names) and ``devices`` (the logical CPUs after
    the call), or ``error`` (its type and message) and ``runtime_error``.
    """
    sequences: list[list[Any]] = [list(counts)]
    if after_an_op is not None:
        sequences.append(["op", after_an_op])
    if len(answers) * len(sequences) > 1 and not hasattr(os, "fork"):
        runs = [_run_jobs([answer], [sequence]) for answer in answers
                for sequence in sequences]
        results = [run[0] for run in runs]
    else:
        results = _run_jobs(list(answers), sequences)
    return [sum(results[index:index + len(sequences)], [])
            for index in range(0, len(results), len(sequences))]


def run_splits_in_fresh_process(fn: Any, counts: list[int],
                                after_an_op: int | None = None) -> list[dict[str, Any]]:
    """Call ``fn(count)`` for each count in turn, in one fresh TensorFlow: what each did (and
    ``after_an_op``: see :func:`run_split_answers`)."""
    source = textwrap.dedent(inspect.getsource(fn))
    return run_split_answers([(fn.__name__, source)], counts, after_an_op)[0]


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
    if "restart" not in asked_more["error"].lower():
        return (f"{labels[2]} raised {asked_more['error']!r}: its message must say what to "
                "do (restart the kernel)")
    if len(results) > len(labels):  # another fresh process: an op ran, then split_cpu(1)
        return _after_an_op_verdict(results[len(labels):])
    return None


def _after_an_op_verdict(results: list[dict[str, Any]]) -> str | None:
    """What ``split_cpu(1)`` did after TensorFlow ran an op (its one CPU device made)."""
    label = ("in another fresh process, after TensorFlow had run an op (which made its one "
             "logical CPU), split_cpu(1)")
    if len(results) < 2 or "op" not in results[0]:
        return f"{label}: the process failed: {results[-1].get('error')}"
    result, expected = results[1], ["/device:CPU:0"]
    if "error" in result:
        return (f"{label} raised {result['error']!r}: TensorFlow refuses the split because "
                "the devices exist, but there is 1, as asked: return their names (only "
                "another number needs a restart)")
    if result["returned"] != expected:
        return f"{label} should return {expected}, it returned {result['returned']}"
    return None
