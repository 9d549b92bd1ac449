"""A write-only log for lesson 08, exercise 1: records go into an OS pipe whose read end only
the check holds, so the model the learner receives carries no readable record of its steps; and
that model, whose training steps wait and write into the log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["TRACE_DELAY_S", "PipeLog", "delayed_model_builder", "pipe_log"]


class PipeLog:
    """A write-only log: records go into an OS pipe whose read end only the check holds.

    The check's model writes when its steps waited and when its ``fit`` returned; the learner's
    function receives the model (and so this object), never the records: reading them back
    needs the read end, which no closure, attribute or default of the model holds."""

    _RECORD = "<cdd"  # kind (b"s" a step's wait, b"f" a fit's return), start, end

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, kind: bytes, start: float, end: float = 0.0) -> None:
        import os
        import struct

        os.write(self._fd, struct.pack(self._RECORD, kind, start, end))


def pipe_log() -> tuple[PipeLog, Callable[[], dict[str, list[Any]]], Callable[[], None]]:
    """``(log, read, close)``: the model's write-only log, the check's reader of every record
    written so far (``{"steps": [(start, end)], "fit_ends": [t]}``), and a closer of both ends."""
    import os
    import struct

    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    size = struct.calcsize(PipeLog._RECORD)
    records: dict[str, list[Any]] = {"steps": [], "fit_ends": []}
    pending = bytearray()

    def read() -> dict[str, list[Any]]:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            pending.extend(chunk)
        while len(pending) >= size:
            kind, start, end = struct.unpack(PipeLog._RECORD, bytes(pending[:size]))
            del pending[:size]
            if kind == b"s":
                records["steps"].append((start, end))
            else:
                records["fit_ends"].append(start)
        return {name: list(values) for name, values in records.items()}

    def close() -> None:
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    return PipeLog(write_fd), read, close


#: Extra seconds of Python when a training step is traced: the first epoch is visibly slower.
TRACE_DELAY_S = 1.0


def delayed_model_builder(num_features: int, num_classes: int, units: int, delay_s: float,
                          log: PipeLog) -> Callable[[], Any]:
    """An MLP whose training steps wait ``delay_s`` (and whose tracing waits longer), writing
    into ``log`` when each step's wait began and ended and when each call of the model's
    ``fit`` returned: the bounds of any timing of its own run. ``log`` is write-only (an OS
    pipe, see ``pipe_log.PipeLog``): nothing the learner's function can reach holds the records."""
    import time

    import keras

    from course_utils.models import mlp
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()

    class StepDelay(keras.layers.Layer):
        """Adds 0 to the logits, after sleeping in every training step."""

        def __init__(self, seconds: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.seconds, self.supports_jit = seconds, False

        def call(self, inputs: Any, training: bool | None = None) -> Any:
            if not training or not self.seconds:
                return inputs
            if not tf.executing_eagerly():
                time.sleep(TRACE_DELAY_S)  # Python runs once, while the step is traced

            def wait() -> np.ndarray:
                start = time.perf_counter()
                time.sleep(self.seconds)
                log.write(b"s", start, time.perf_counter())
                return np.float32(0.0)

            zero = tf.reshape(tf.stop_gradient(tf.py_function(wait, [], tf.float32)), [])
            return inputs + tf.cast(zero, inputs.dtype)

    def make_model() -> Any:
        base = mlp(num_features, num_classes, hidden_units=(units, units))
        model = keras.Model(base.input, StepDelay(delay_s, dtype="float32")(base.output))
        fit = model.fit

        def logged_fit(*args: Any, **kwargs: Any) -> Any:
            try:
                return fit(*args, **kwargs)
            finally:
                log.write(b"f", time.perf_counter())

        model.fit = logged_fit
        return model

    return make_model
