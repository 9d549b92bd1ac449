"""Lesson 01's exercise 1: the check's storage, a ``read`` that waits and counts how many reads
wait at once and which ``read`` op made each (lesson 00's exercise 4 asks the same of its reads:
the returned dataset's own graph must do them, not a thread or generator of the answer's own),
its ``decode``, the kinds of op a pipeline's graph holds, and the slow reference pipeline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import py_function_token
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["slow_pipeline", "storage"]


def slow_pipeline(source: Any, read: Callable[[Any], Any], decode: Callable[[Any], Any],
                  batch_size: int) -> Any:
    """The reference: one element at a time, tf.data's automatic optimizations off."""
    from course_utils.data import without_default_optimizations

    return without_default_optimizations(source.map(read).map(decode).batch(batch_size))


def storage(seconds: float, reads: dict[str, Any], overlapped_from: int
            ) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """``read`` (waits ``seconds``, then returns ``3x + 1``) and ``decode`` (``x / 2``). Every
    read adds one to ``reads["count"]``; ``reads["most_at_once"]`` keeps the most reads that
    waited at the same time, ``reads["overlapped"]`` counts the reads that started with
    ``overlapped_from`` or more waiting, ``reads["by"]`` lists the token of the read op
    that made each read (None for an eager call: no op of any dataset's graph), and
    ``reads["ops"]`` the tokens of every read op made."""
    tf = _tf()
    for key in ("count", "most_at_once", "overlapped"):
        reads.setdefault(key, 0)
    reads.setdefault("by", [])
    in_flight = {"now": 0}
    made: list[str | None] = reads.setdefault("ops", [])  # every read op's token, in order
    lock = threading.Lock()  # parallel reads run in several tf.data threads

    def wait_and_read(value: Any, op: int) -> Any:
        with lock:
            in_flight["now"] += 1
            reads["most_at_once"] = max(reads["most_at_once"], in_flight["now"])
            reads["overlapped"] += in_flight["now"] >= overlapped_from
        time.sleep(seconds)
        with lock:
            in_flight["now"] -= 1
            reads["count"] += 1
            reads["by"].append(made[op])
        return np.int64(3 * int(value) + 1)

    def read(index: Any) -> Any:
        with lock:
            op = len(made)
            made.append(None)
        record = tf.py_function(lambda value: wait_and_read(value, op), [index], tf.int64)
        record.set_shape([])
        made[op] = py_function_token(record)
        return record

    def decode(record: Any) -> Any:
        return tf.cast(record, tf.float32) / 2.0

    return read, decode
