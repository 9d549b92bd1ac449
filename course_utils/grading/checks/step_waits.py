"""Lesson 00's exercise 3 (time a step by hand), where the waits cannot be read.

The answer's ``next_batch`` and ``train_step`` hold no wait: each sends one byte down a pipe
and blocks until the check's :class:`WaitServer`, a thread of the checking process, has waited
as long as the case says and answered. The answer runs in a copy of the process forked before
the cases are drawn (``checks/forked_call.py``), so neither its arguments' closures nor any
frame or object of that copy holds a wait or an expected value: it can only time the calls.
:class:`CodesRun` records, in that copy, whether the answer called one of the course's timing
helpers (``cu.bench``'s, or a copy of one), or escaped the recording (the checks' one guard,
``call_guard``: its profiler removed, a thread or a process it cannot watch, its record
changed), and the order of its calls of the parts and of the clocks (``time.perf_counter`` and
its kin, however reached): a whole step is timed as one only where no clock was read between
the ``next_batch`` that made its batch and its ``train_step`` (``whole_steps_timed``), so a
"whole step" added up from pieces timed apart fails.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.call_guard import CallsInto, watching_problem

__all__ = ["CLOCK", "CodesRun", "WaitServer", "parts_called", "whole_steps_timed"]

#: The event a clock read leaves in :attr:`CodesRun.events` ("i", "c", "w": the parts' calls).
CLOCK = "t"


def _clocks() -> set[Any]:
    """Every clock of ``time`` a timing can read (``timeit.default_timer`` is one of them)."""
    import time as clock_module

    names = ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic",
             "monotonic_ns", "process_time", "process_time_ns", "thread_time", "thread_time_ns")
    return {getattr(clock_module, name) for name in names if hasattr(clock_module, name)}


def _is_clock(function: Any, clocks: set[Any]) -> bool:
    """True for a clock of ``time`` or ``datetime``'s ``now``/``utcnow``/``today``."""
    try:
        if function in clocks:
            return True
    except TypeError:  # an unhashable callable
        return False
    return (getattr(function, "__name__", "") in ("now", "utcnow", "today")
            and getattr(function, "__self__", None) in (datetime.datetime, datetime.date))


def whole_steps_timed(events: str) -> tuple[int, int]:
    """(steps on a fresh batch, those timed as one whole step): a "w" whose batch came from
    the "i" right before it (no other part called between) with no clock read ("t") between
    that "i" and it."""
    fresh = timed = 0
    last_part, clock_since = "", False
    for event in events:
        if event == CLOCK:
            clock_since = True
            continue
        if event == "w":
            fresh += 1
            timed += last_part == "i" and not clock_since
        last_part, clock_since = event, False
    return fresh, timed


def _helper_codes() -> set[Any]:
    """The code objects of the course's timing helpers, which this exercise writes by hand:
    every function of ``cu.bench`` that reads the clock (``time_function`` timing one call at
    a time in the answer's own turns is no loop of its own either; r00 L2)."""
    from course_utils import bench

    return {helper.__code__ for helper in (
        bench.time_interleaved, bench.time_function, bench._seconds_of_one_call,
        bench.dataset_throughput, bench.compare_throughput)}


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
        self.events: list[str] = []  # "i", "c", "w" (the parts, told by the stubs), CLOCK
        self._clocks = _clocks()
        self.guard = CallsInto(*_helper_codes(), also=self._saw)

    def _saw(self, frame: Any, c_function: Any) -> None:
        if c_function is None:
            self.seen.add(frame.f_code)
        elif _is_clock(c_function, self._clocks):
            self.events.append(CLOCK)

    def finish(self) -> None:
        """Reads the guard's verdict (while it is still active)."""
        found = self.guard.take()
        self.problem = watching_problem(found)
        self.named = found[1:] if self.problem else found

    @property
    def switched_off(self) -> str | bool:
        """What went wrong with the watching (its message), or False."""
        return self.problem or False

    def called_a_helper(self) -> str:
        """The helper called (``time_function``, ``time_interleaved (a copy of it)``, ...), or
        "" when none was: a helper, or a copy of one (same bytecode and names)."""
        named = [name for name in self.named if not name.startswith("<")]
        if named or self.named:
            return (named or self.named)[0]
        helpers = {_signature(code): code.co_name for code in _helper_codes()}
        return next((f"{helpers[_signature(code)]} (a copy of it)" for code in self.seen
                     if _signature(code) in helpers), "")


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
               ) -> Callable[[int], tuple[Any, str | bool, str, str]]:
        """``answer(repeats)``: ``fn(next_batch, train_step, batch, repeats)``'s result (floats
        where it holds numbers), what went wrong with its recording (a message, or False),
        the timing helper it called ("" if none), and its calls in order (``CodesRun.events``, a
        string: "i" next_batch, "c" a step on the batch given, "w" on the batch the latest
        next_batch made, "x" on another batch, ``CLOCK`` a clock read)."""
        requests, replies = self._requests[1], self._replies[0]
        batch = np.full(4, -1)
        running: list[CodesRun] = []
        made: list[Any] = [None]  # the batch the latest next_batch returned

        def ask(kind: bytes) -> int:
            os.write(requests, kind)
            return int.from_bytes(_read(replies, 4), "little")

        def note(event: str) -> None:
            if running:
                running[0].events.append(event)

        def next_batch() -> np.ndarray:
            note("i")
            made[0] = np.full(4, ask(b"i"))
            return made[0]

        def train_step(given: Any) -> float:
            note("c" if given is batch else "w" if given is made[0] else "x")
            ask(b"c" if given is batch else b"w")
            return float(np.sum(given))

        def answer(repeats: int) -> tuple[Any, str | bool, str, str]:
            codes_run = CodesRun()
            running[:] = [codes_run]
            with codes_run.guard:
                result = fn(next_batch, train_step, batch, repeats)
                codes_run.finish()
            running.clear()
            try:
                result = {key: float(value) for key, value in result.items()}
            except (AttributeError, TypeError, ValueError):
                pass
            return (result, codes_run.switched_off, codes_run.called_a_helper(),
                    "".join(codes_run.events))

        return answer

    def serve(self, input_s: float, compute_s: float, disturb: Any, calls: list[str],
              transfer_s: float = 0.0, repeats: int = 0, first_last_s: float = 0.0) -> None:
        """From now on answer with these waits, recording into ``calls``: a step on a fresh
        batch waits ``transfer_s`` more (its copy to the device). ``disturb``: False, or the
        phases ``(inputs, steps)``: the ``k``-th next_batch call (from 1) waits the
        disturbance more where ``(k + inputs) % every == 0``; the ``k``-th step on the batch
        given waits ``first_last_s`` more where ``(k - 1 + steps) % 3 == 0``: a third of them,
        so three cases with the phases 0, 1 and 2 disturb every index of those steps once (a
        step on a fresh batch is not: a disturbed next_batch already is its disturbance, and
        both would disturb more than half of the whole steps)."""
        self._case = {"input": input_s, "compute": compute_s, "disturb": disturb,
                      "calls": calls, "transfer": transfer_s, "repeats": repeats,
                      "first_last": first_last_s}
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _extra(self, case: dict[str, Any], kind: str) -> float:
        """The disturbance of this call (seconds), by its kind's count so far."""
        if not case["disturb"]:
            return 0.0
        inputs, steps = case["disturb"]
        count = case["calls"].count(kind)
        if kind == "i":
            return self._disturbance if (count + inputs) % self._every == 0 else 0.0
        late = kind == "c" and (count - 1 + steps) % 3 == 0
        return case["first_last"] if late else 0.0

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
            value = case["calls"].count("i") if kind == "i" else 0
            wait = {"i": case["input"], "c": case["compute"]}.get(
                kind, case["compute"] + case["transfer"])
            time.sleep(wait + self._extra(case, kind))
            os.write(self._replies[1], value.to_bytes(4, "little"))

    def close(self) -> None:
        """End the thread (after the copy that held the other ends has ended), close all."""
        os.close(self._requests[1])  # the last writer gone: the thread reads the end
        if self._thread is not None:
            self._thread.join(timeout=10)
        for fd in (self._requests[0], *self._replies):
            os.close(fd)
