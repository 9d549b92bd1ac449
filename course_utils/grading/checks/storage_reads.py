"""Lesson 01's exercise 1: the check's storage and licence service – a ``read`` and an
``is_current`` that wait and count how many of their calls wait at once and which op made
each (lesson 00's exercise 4 asks the same of its reads: the returned dataset's own graph must
make the calls, not a thread or generator of the answer's own), its ``decode``, the slow
reference pipeline, and what the counts of one epoch say of a pipeline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import (
    handed_on,
    py_function_token,
    py_function_tokens,
)
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["calls_problem", "overlap_problem", "slow_pipeline", "storage", "waiting_stage"]


def slow_pipeline(source: Any, read: Callable[[Any], Any], is_current: Callable[[Any], Any],
                  decode: Callable[[Any], Any], batch_size: int) -> Any:
    """The reference: one element at a time, tf.data's automatic optimizations off."""
    from course_utils.data import without_default_optimizations

    dataset = source.map(read).filter(is_current).map(decode).batch(batch_size)
    return without_default_optimizations(dataset)


def waiting_stage(seconds: float, calls: dict[str, Any], overlapped_from: int,
                  result: Callable[[int], Any], dtype: Any) -> Callable[[Any], Any]:
    """A step's function that waits ``seconds`` in a ``tf.py_function``, then returns
    ``result(value)`` as ``dtype``. Every call adds one to ``calls["count"]``;
    ``calls["most_at_once"]`` keeps the most calls that waited at the same time,
    ``calls["overlapped"]`` counts the calls that started with ``overlapped_from`` or more
    waiting (itself included), ``calls["by"]`` lists the token of the op that made each call
    (None for an eager call: no op of any dataset's graph), ``calls["ops"]`` every op's token."""
    tf = _tf()
    for key in ("count", "most_at_once", "overlapped"):
        calls.setdefault(key, 0)
    calls.setdefault("by", [])
    in_flight = {"now": 0}
    made: list[str | None] = calls.setdefault("ops", [])  # every op's token, in order
    lock = threading.Lock()  # parallel calls run in several tf.data threads

    def wait(value: Any, op: int) -> Any:
        with lock:
            in_flight["now"] += 1
            calls["most_at_once"] = max(calls["most_at_once"], in_flight["now"])
            calls["overlapped"] += in_flight["now"] >= overlapped_from
        time.sleep(seconds)
        with lock:
            in_flight["now"] -= 1
            calls["count"] += 1
            calls["by"].append(made[op])
        return result(int(value))

    def stage(value: Any) -> Any:
        with lock:
            op = len(made)
            made.append(None)
        out = tf.py_function(lambda given: wait(given, op), [value], dtype)
        out.set_shape([])
        made[op] = py_function_token(out)
        return out

    return stage


def storage(seconds: float, reads: dict[str, Any], lookups: dict[str, Any],
            overlapped_from: int, withdrawn: set[int]
            ) -> tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    """``read`` (waits ``seconds``, then returns the record ``3x + 1``), ``is_current`` (asks
    the licence service: waits ``seconds``, then True unless the record is in ``withdrawn``)
    and ``decode`` (``record / 2``); ``reads`` and ``lookups`` count their calls
    (``waiting_stage``)."""
    tf = _tf()
    read = waiting_stage(seconds, reads, overlapped_from,
                         lambda index: np.int64(3 * index + 1), tf.int64)
    is_current = waiting_stage(seconds, lookups, overlapped_from,
                               lambda record: np.bool_(record not in withdrawn), tf.bool)

    def decode(record: Any) -> Any:
        return tf.cast(record, tf.float32) / 2.0

    return read, is_current, decode


def calls_problem(dataset: Any, stages: dict[str, dict[str, Any]]) -> str | None:
    """Whether ``dataset``'s own ops made every counted call of each stage (``{"read": reads,
    "is_current": lookups}``), and its graph runs no Python and reaches no state besides."""
    ops = py_function_tokens(dataset)
    for name, calls in stages.items():
        outside = sum(token not in ops for token in calls["by"])
        if outside:
            return (f"{outside} of the epoch's {len(calls['by'])} calls of {name} came from no "
                    f"{name} op of the returned dataset's graph (called in Python: in a thread "
                    "or a generator of your own): which tf.data step of the dataset calls it, "
                    "and how many calls run at once?")
    # an op that never runs (take(0)) beside a generator, or an iterator or a queue made
    # outside the pipeline, that hands on what another pipeline or thread read
    own, pulls = handed_on(dataset, {token for calls in stages.values()
                                     for token in calls["ops"]})
    return (f"your pipeline runs {own} Python function(s) of its own (a generator, a "
            f"py_function) and pulls from {pulls} iterator(s), queue(s) or other state "
            "made outside it (a file too: a cache whose filename your pipeline computes, "
            "or a cache in a file inside a step's function, counts): reads handed on from "
            "another pipeline or thread are not this dataset's; which tf.data step of it "
            "reads, and how many at once?"
            ) if own or pulls else None


def overlap_problem(calls: dict[str, Any], name: str, most: int, share: float,
                    advice: str) -> str | None:
    """Whether ``most`` or more calls of a stage waited at once in the epoch counted, and
    ``share`` of them or more started with ``most // 2`` or more waiting."""
    overlapped = calls["most_at_once"]
    started = calls["overlapped"] / max(calls["count"], 1)
    least = most // 2
    if overlapped < most:
        return (f"at most {overlapped} {name}(s) waited at the same time during an epoch; at "
                f"least {most} must overlap ({advice})")
    if started < share:
        return (f"{started:.0%} of the epoch's {name}s started while {least - 1} or more others "
                f"waited ({least} or more at once, the call itself included; at least "
                f"{share:.0%} needed; {overlapped} at once at most): the {name}s overlapped for "
                f"part of the epoch only, or too few waited as most of them started (fewer "
                f"than {least} at a time, or small waves started together)")
    return None
