"""Lesson 00's exercise 3 (time a step by hand), where the waits cannot be read.

The answer's ``next_batch`` and ``train_step`` hold no wait: each sends one byte down a pipe
and blocks until the check's :class:`WaitServer`, a thread of the checking process, has waited
as long as the case says and answered. The answer runs in a copy of the process forked before
the cases are drawn (``checks/forked_call.py``), so neither its arguments' closures nor any
frame or object of that copy holds a wait or an expected value: it can only time the calls.
:class:`CodesRun` records, in that copy, whether the answer called the course's timing helper
(or a copy of it), or escaped the recording (the checks' one guard, ``call_guard``: its
profiler removed, a thread or a process it cannot watch, its record changed).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.call_guard import CallsInto, watching_problem

__all__ = ["CodesRun", "WaitServer", "parts_called"]


def _helper_codes() -> set[Any]:
    """The code objects of the course's timing helpers, which this exercise writes by hand."""
    from course_utils import bench

    return {bench.time_interleaved.__code__}


def _signature(code: Any) -> tuple[Any, ...]:
    """What a copy of a function keeps whatever its file, line, name or local names: the
    globals and attributes it uses, in order, and its number of arguments (an ``exec``'d or
    pasted copy of a helper has the helper's; its bytecode can differ, e.g. without the
    module's ``from __future__ import annotations``)."""
    return code.co_names, code.co_argcount, code.co_kwonlyargcount


class CodesRun:
    """Records the code object of every Python function called while its ``guard`` (the
    checks' one guard, ``call_guard.CallsInto``) is active, in every thread it watches, and
    what went wrong with the watching (``problem``: the profiler removed, a thread it cannot
    watch, a process started, its record changed; see ``call_guard``). Use ``with
    codes_run.guard:`` in the frame that calls the answer, and ``finish()`` inside it."""

    def __init__(self) -> None:
        self.seen: set[Any] = set()
        self.problem: str | None = None
        self.named: list[str] = []
        self.guard = CallsInto(*_helper_codes(), also=self._saw)

    def _saw(self, frame: Any) -> None:
        self.seen.add(frame.f_code)

    def finish(self) -> None:
        """Reads the guard's verdict (while it is still active)."""
        found = self.guard.take()
        self.problem = watching_problem(found)
        self.named = found[1:] if self.problem else found

    @property
    def switched_off(self) -> str | bool:
        """What went wrong with the watching (its message), or False."""
        return self.problem or False

    def called_a_helper(self) -> bool:
        """True when a helper, or a copy of one (same bytecode and names), was called."""
        helpers = {_signature(code) for code in _helper_codes()}
        return bool(self.named) or any(_signature(code) in helpers for code in self.seen)


def parts_called(calls: list[str]) -> list[str]:
    """The parts called, in order: "W" a whole step (next_batch, then train_step on its batch),
    "I" next_batch alone, "C" train_step on the batch given."""
    parts, index = [], 0
    while index < len(calls):
        if calls[index] == "i" and calls[index + 1:index + 2] == ["w"]:
            parts.append("W")
            index += 2
            continue
        parts.append({"i": "I", "c": "C"}.get(calls[index], "W"))
        index += 1
    return parts


def _read(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the check's wait server ended")
        data += chunk
    return data


class WaitServer:
    """The check's side: pipes made now, before the fork; :meth:`answer` (made now too, so the
    copy has it) calls the learner's function with ``next_batch``/``train_step`` that ask this
    server; :meth:`serve` sets a case's waits and the list its calls are recorded in ("i":
    next_batch, "c": train_step on the batch given, "w": on another batch)."""

    def __init__(self, disturbed_every: int, disturbance_s: float) -> None:
        self._requests = os.pipe()
        self._replies = os.pipe()
        self._every, self._disturbance = disturbed_every, disturbance_s
        self._case: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def answer(self, fn: Callable[..., Any]
               ) -> Callable[[int], tuple[Any, str | bool, bool]]:
        """``answer(repeats)``: ``fn(next_batch, train_step, batch, repeats)``'s result (floats
        where it holds numbers), what went wrong with its recording (a message, or False),
        whether it called a timing helper."""
        requests, replies = self._requests[1], self._replies[0]
        batch = np.full(4, -1)

        def ask(kind: bytes) -> int:
            os.write(requests, kind)
            return int.from_bytes(_read(replies, 4), "little")

        def next_batch() -> np.ndarray:
            return np.full(4, ask(b"i"))

        def train_step(given: Any) -> float:
            ask(b"c" if given is batch else b"w")
            return float(np.sum(given))

        def answer(repeats: int) -> tuple[Any, str | bool, bool]:
            codes_run = CodesRun()
            with codes_run.guard:
                result = fn(next_batch, train_step, batch, repeats)
                codes_run.finish()
            try:
                result = {key: float(value) for key, value in result.items()}
            except (AttributeError, TypeError, ValueError):
                pass
            return result, codes_run.switched_off, codes_run.called_a_helper()

        return answer

    def serve(self, input_s: float, compute_s: float, disturb: bool, calls: list[str],
              transfer_s: float = 0.0, repeats: int = 0, first_last_s: float = 0.0) -> None:
        """From now on answer with these waits, recording into ``calls``: a step on a fresh
        batch waits ``transfer_s`` more (its copy to the device); where ``disturb``, the first
        and the ``repeats``-th step on the batch given wait ``first_last_s`` more."""
        self._case = {"input": input_s, "compute": compute_s, "disturb": disturb,
                      "calls": calls, "transfer": transfer_s, "repeats": repeats,
                      "first_last": first_last_s}
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                kind = os.read(self._requests[0], 1).decode()
            except OSError:
                return
            if not kind:
                return
            case = self._case
            case["calls"].append(kind)
            value = 0
            if kind == "i":
                value = case["calls"].count("i")
                disturbed = case["disturb"] and value % self._every == 0
                time.sleep(case["input"] + (self._disturbance if disturbed else 0.0))
            elif kind == "c":
                given = case["calls"].count("c")
                disturbed = case["disturb"] and given in (1, case["repeats"])
                time.sleep(case["compute"] + (case["first_last"] if disturbed else 0.0))
            else:
                time.sleep(case["compute"] + case["transfer"])
            os.write(self._replies[1], value.to_bytes(4, "little"))

    def close(self) -> None:
        """End the thread (after the copy that held the other ends has ended), close all."""
        os.close(self._requests[1])  # the last writer gone: the thread reads the end
        if self._thread is not None:
            self._thread.join(timeout=10)
        for fd in (self._requests[0], *self._replies):
            os.close(fd)
