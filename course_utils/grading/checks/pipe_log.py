"""A write-only log for lesson 08, exercise 1, and the model whose training steps wait and write
into it.

The log is an OS pipe whose read end belongs to a child process, which copies the log to the check
once the check closes the pipe (:mod:`~course_utils.grading.checks.child_pipe`, as lesson 04's
coordinator watch): descriptors belong to the whole process, and the learner's code runs in it, so
the check's process holds no descriptor to read the records back with (nor to take one out), and
nothing comes out of the child before the check reads it; the child makes itself not dumpable
(Linux) before it makes the pipe, so that its read end cannot be opened through ``/proc`` either
(what still can reach it, ``CAP_SYS_PTRACE`` among others, is said in
:mod:`~course_utils.grading.checks.child_pipe`). The write end is reachable (its descriptor is in
the model's closures), so a learner's code can add records, not take back one the model wrote: a
step's record (its wait's start and end) is written in one write, the check's reader names bytes the
model never writes (a frame of another kind, a start without its end, a part frame), a write the
pipe refuses (its descriptor closed, or the pipe full while the child is stopped) ends the child, so
that its copy is lost and the check says so, and a copy held open past the call (a duplicated
descriptor, or any other descriptor on the pipe at a write) is said too. Added steps change the
count of steps the check asks for. The functions the model and the reader call (``os.write``,
``os.kill``, ``struct.pack``, ``time.perf_counter``, ``time.sleep``) are bound when the course is
imported. Still passes: code that moves the pipe's descriptors for the call (``os.dup2`` a pipe of
its own over the write end, forged records through a copy of the real one): no check in the same
process can stop that."""

from __future__ import annotations

import os
import select
import signal
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.child_pipe import COPY as _COPY
from course_utils.grading.checks.child_pipe import TRACED as _TRACED
from course_utils.grading.checks.child_pipe import child_reader as _child_reader
from course_utils.grading.checks.child_pipe import closer as _closer
from course_utils.grading.checks.child_pipe import end as _end
from course_utils.grading.checks.child_pipe import killer as _killer
from course_utils.grading.checks.child_pipe import pipe_writer as _pipe_writer
from course_utils.grading.checks.child_pipe import starter as _starter

__all__ = ["TRACE_DELAY_S", "delayed_model_builder", "pipe_log"]

#: A record: kind (b"s" a step's wait began, b"e" it ended, b"f" a ``fit`` returned), time.
_LAYOUT = "<cd"
#: Bound once, when the course is imported, into the closures made below.
_BOUND = {"write": os.write, "read": os.read, "pack": struct.pack, "unpack": struct.unpack,
          "select": select.select, "clock": time.monotonic, "kill": os.kill}

Log = Callable[..., None]


def _replay(events: list[tuple[bytes, float]]) -> dict[str, list[Any]] | None:
    """``{"steps": [(start, end)], "fit_ends": [t]}`` from the pipe's records, or None where a
    record is not one the model writes (or a step's start is not followed by its end)."""
    records: dict[str, list[Any]] = {"steps": [], "fit_ends": []}
    at = 0
    while at < len(events):
        kind, number = events[at]
        if kind == b"s" and events[at + 1:at + 2] and events[at + 1][0] == b"e":
            records["steps"].append((number, events[at + 1][1]))
            at += 2
        elif kind == b"f":
            records["fit_ends"].append(number)
            at += 1
        else:
            return None
    return records


def _make_pipe_log(copy: tuple[str, ...], parts: dict[str, Any], bound: dict[str, Any]) -> Any:
    """:func:`pipe_log`, with every function it and its reader call bound now (at import)."""
    start = _starter()
    writer, reader, ending, closing, killer, replay, judged = (
        parts[name] for name in ("writer", "reader", "end", "closer", "killer", "replay",
                                 "judged"))
    bound = dict(bound)

    def pipe_log() -> tuple[Log, Callable[[], dict[str, list[Any]] | str], Callable[[], None]]:
        """``(log, read, close)``: the model's write-only log (``log((kind, time), ...)``, in
        one write), the check's reader of the records (``{"steps": [(start, end)],
        "fit_ends": [t]}``, or what is wrong with the log; the first call closes the pipe,
        later calls give the same) and a closer that ends the child."""
        if start is None:
            raise OSError("lesson 08's step log is read with select: it needs Linux or macOS")
        write_fd, child = start(copy)
        close_write, current = closing(write_fd)
        log = writer(current, killer(bound["kill"], child.pid), _LAYOUT, bound["write"],
                     bound["pack"])
        drain, read_once = reader(close_write, child, _LAYOUT, bound, current), []

        def read() -> dict[str, list[Any]] | str:
            if not read_once:
                read_once.append(judged(drain(), child.returncode, replay))
            found = read_once[0]
            return found if isinstance(found, str) else {k: list(v) for k, v in found.items()}

        def close() -> None:
            ending(close_write, child)

        return log, read, close

    return pipe_log


def _judged(events: Any, status: int | None, replay: Any) -> dict[str, list[Any]] | str:
    """The records of ``events`` (the child's copy, see ``child_pipe.child_reader``; the child
    exited with ``status``), or what is wrong with the log."""
    leave = "train the model you are given with its own fit, and leave its step log alone"
    if events is None:
        return ("the check's step log was held open after your function returned (a copy of "
                f"its descriptor kept): {leave}")
    if events == _TRACED:
        return ("the check's log copier was traced (ptrace) before it made itself undumpable, "
                f"so its log cannot be trusted: {leave}")
    if isinstance(events, int):
        return (f"the check's log copier (a child Python: {_COPY[0]!r} -I -S) exited with "
                f"status {events} before it copied the log: this Python cannot run it, so the "
                "check cannot time your run here (not a fault of your answer; tell your "
                "instructor)")
    if status == -signal.SIGKILL:
        return ("a write into the check's step log was refused while your function ran (its "
                f"descriptor closed, or the pipe full), so the log was lost: {leave}")
    records = replay(events)
    if records is None:
        return ("the check's step log holds bytes its model never wrote (written into it "
                f"while your function ran): {leave}")
    return records


pipe_log = _make_pipe_log(
    _COPY, {"writer": _pipe_writer, "reader": _child_reader, "end": _end, "closer": _closer,
            "killer": _killer, "replay": _replay, "judged": _judged}, _BOUND)


#: Extra seconds of Python when a training step is traced: the first epoch is visibly slower.
TRACE_DELAY_S = 1.0


def delayed_model_builder(num_features: int, num_classes: int, units: int, delay_s: float,
                          log: Log, *, slower: tuple[int, int, float] = (0, 0, 1.0),
                          pause: tuple[int, int, float] = (0, 0, 0.0),
                          _clock: tuple[Any, Any] = (time.perf_counter, time.sleep)
                          ) -> Callable[[], Any]:
    """An MLP whose training steps wait ``delay_s`` (the steps ``first <= n < end`` of
    ``slower = (first, end, factor)``, counted from 0 over the model's life, ``factor`` times
    longer; and whose tracing waits longer), writing
    into ``log`` when each step's wait began and ended and when each call of the model's
    ``fit`` returned: the bounds of any timing of its own run. Its ``fit`` also sleeps after
    the epochs ``first <= n < end`` of ``pause = (first, end, seconds)`` (counted from 0 over
    the model's life), ``seconds`` each (a callback: outside every step, inside the span of the
    epochs around it).
    ``log`` is write-only (an OS pipe whose read end a child process holds, see
    :func:`pipe_log`). ``_clock`` (the clock and
    sleep the model uses) is bound when the course is imported, ``TRACE_DELAY_S`` when the
    builder is made (before the learner's code runs: setting the module's value then changes
    nothing in this model; tests patch it before the check)."""
    import keras

    from course_utils.models import mlp
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    now, sleep = _clock
    trace_delay_s = float(TRACE_DELAY_S)
    first_slow, end_slow, factor = slower
    first_pause, end_pause, pause_s = pause
    waits, ends = [0], [0]  # the training steps this model has waited in, its epochs ended

    class StepDelay(keras.layers.Layer):
        """Adds 0 to the logits, after sleeping in every training step."""

        def __init__(self, seconds: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.seconds, self.supports_jit = seconds, False

        def call(self, inputs: Any, training: bool | None = None) -> Any:
            if not training or not self.seconds:
                return inputs
            if not tf.executing_eagerly():
                sleep(trace_delay_s)  # Python runs once, while the step is traced

            def wait() -> np.ndarray:
                start, step = now(), waits[0]
                waits[0] += 1
                sleep(self.seconds * (factor if first_slow <= step < end_slow else 1.0))
                log((b"s", start), (b"e", now()))  # one write: a start and its end
                return np.float32(0.0)

            zero = tf.reshape(tf.stop_gradient(tf.py_function(wait, [], tf.float32)), [])
            return inputs + tf.cast(zero, inputs.dtype)

    class EpochPause(keras.callbacks.Callback):
        """Sleeps ``pause_s`` after the epochs of ``pause``, between an epoch's last step and
        the next's first: a timing of the epochs spans it, the steps' own times leave it out."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            ends[0] += 1
            if first_pause <= ends[0] - 1 < end_pause:
                sleep(pause_s)

    def make_model() -> Any:
        base = mlp(num_features, num_classes, hidden_units=(units, units))
        model = keras.Model(base.input, StepDelay(delay_s, dtype="float32")(base.output))
        fit = model.fit

        def logged_fit(*args: Any, **kwargs: Any) -> Any:
            args, given = list(args), args[5] if len(args) > 5 else kwargs.get("callbacks")
            if isinstance(given, keras.callbacks.CallbackList):
                given.append(EpochPause())
            else:  # fit's sixth argument is ``callbacks``
                callbacks = [*(given or ()), EpochPause()]
                args[5:6] = [callbacks] if len(args) > 5 else []
                kwargs.update({} if len(args) > 5 else {"callbacks": callbacks})
            try:
                return fit(*args, **kwargs)
            finally:
                log((b"f", now()))

        model.fit = logged_fit
        return model

    return make_model
