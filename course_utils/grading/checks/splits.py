"""Lesson 00's exercise 2, run where it must run: a split into logical devices, in a fresh
TensorFlow.

``run_split_answers`` calls each answer's function several times in one process that has
imported TensorFlow and nothing else (the course package cannot be imported there);
``split_verdict`` says what a run of the calls ``n, n, n + 1, n`` did wrong.
"""

from __future__ import annotations

import inspect
import json
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
        try:
            names = namespace[name](count)
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            results.append({{"returned": [str(n) for n in names], "devices": devices}})
        except Exception as error:
            results.append({{"error": f"{{type(error).__name__}}: {{error}}",
                             "runtime_error": isinstance(error, RuntimeError)}})
    return results

answers = {answers!r}
if len(answers) == 1:  # this process is fresh: no fork (Windows has none)
    print("RESULT " + json.dumps(calls(*answers[0], {counts!r})))
for name, source in answers if len(answers) > 1 else []:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            line = json.dumps(calls(name, source, {counts!r}))
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


def run_split_answers(answers: list[tuple[str, str]],
                      counts: list[int]) -> list[list[dict[str, Any]]]:
    """For each ``(name, source)``, call ``name(count)`` per count, in a fresh TensorFlow.

    One process imports TensorFlow (the course package cannot be imported there); a single
    answer runs in it, several each in a child forked before any device exists (POSIX only):
    each answer meets TensorFlow as a fresh process does. Each call's result holds
    ``returned`` (the names) and ``devices`` (the logical CPUs after the call), or ``error``
    (its type and message) and ``runtime_error``.
    """
    script = _SPLIT_SCRIPT.format(answers=list(answers), counts=list(counts))
    done = run_cpu_only(["-c", script], timeout=300)  # TensorFlow starts slowly when busy
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]
    if len(results) < len(answers):
        error = done.stderr.strip().splitlines()
        line = error[-1] if error else f"the process ended with code {done.returncode}"
        results += [[{"error": line, "runtime_error": False}]] * (len(answers) - len(results))
    return results


def run_splits_in_fresh_process(fn: Any, counts: list[int]) -> list[dict[str, Any]]:
    """Call ``fn(count)`` for each count in turn, in one fresh TensorFlow: what each did."""
    source = textwrap.dedent(inspect.getsource(fn))
    return run_split_answers([(fn.__name__, source)], counts)[0]


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
    return None
