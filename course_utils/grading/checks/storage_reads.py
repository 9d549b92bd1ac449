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

__all__ = ["LOOKUPS_ADVICE", "READS_ADVICE", "calls_problem", "overlap_problem",
           "records_problem", "slow_pipeline", "storage", "waiting_stage"]

#: What check_fast_pipeline tells a pipeline whose reads, or lookups, overlap too little.
READS_ADVICE = ("AUTOTUNE or a fixed number alone stops at one thread per logical CPU this "
                "process may use, the size of tf.data's default pool, and a read map that "
                "is not parallel waits one read at a time: how many reads run at once, and "
                "on how many threads?")
LOOKUPS_ADVICE = ("filter calls its predicate one record at a time, whatever the pool or "
                  "the options say, and filter_parallelization leaves a predicate that "
                  "waits in Python alone; a loop inside one step's function (tf.map_fn, a "
                  "while loop) calls it one at a time too: which step that does take "
                  "num_parallel_calls could ask is_current for it?")


def slow_pipeline(source: Any, read: Callable[[Any], Any], is_current: Callable[[Any], Any],
                  decode: Callable[[Any], Any], batch_size: int) -> Any:
    """The reference: one element at a time, tf.data's automatic optimizations off."""
    from course_utils.data import without_default_optimizations

    dataset = source.map(read).filter(is_current).map(decode).batch(batch_size)
    return without_default_optimizations(dataset)


def waiting_stage(seconds: float, calls: dict[str, Any], overlapped_from: int,
                  result: Callable[[int, int], Any], dtype: Any) -> Callable[[Any], Any]:
    """A step's function that waits ``seconds`` in a ``tf.py_function``, then returns
    ``result(value, number)`` as ``dtype``, ``number`` the call's place among the calls
    started since ``calls["started"]`` was last set to 0. Every call adds one to
    ``calls["count"]``; ``calls["most_at_once"]`` keeps the most calls that waited at the
    same time, ``calls["overlapped"]`` counts the calls that started with
    ``overlapped_from`` or more waiting (itself included), ``calls["alone"]`` those that
    started with no other waiting, as the call before them did (one call after another, in
    turn), ``calls["by"]`` lists the token of the op that made each call (None for an eager
    call: no op of any dataset's graph), ``calls["ops"]`` every op's token."""
    tf = _tf()
    for key in ("count", "most_at_once", "overlapped", "alone", "started"):
        calls.setdefault(key, 0)
    calls.setdefault("by", [])
    in_flight = {"now": 0, "alone": False}
    made: list[str | None] = calls.setdefault("ops", [])  # every op's token, in order
    lock = threading.Lock()  # parallel calls run in several tf.data threads

    def wait(value: Any, op: int) -> Any:
        with lock:
            in_flight["now"] += 1
            calls["most_at_once"] = max(calls["most_at_once"], in_flight["now"])
            calls["overlapped"] += in_flight["now"] >= overlapped_from
            alone = in_flight["now"] == 1  # and the stage's call before it too: in turn
            calls["alone"] += alone and in_flight["alone"]
            in_flight["alone"] = alone
            number = calls["started"]
            calls["started"] += 1
            answer = result(int(value), number)  # decided as the call starts, in its turn
        time.sleep(seconds)
        with lock:
            in_flight["now"] -= 1
            calls["count"] += 1
            calls["by"].append(made[op])
        return answer

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
            overlapped_from: int, draw: np.random.Generator
            ) -> tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    """``read`` (waits ``seconds``, then returns the record ``3x + 1 + 4096 m``, ``m`` drawn
    on every call: a record computed from its index is none that read returned),
    ``is_current`` (asks the licence service: waits ``seconds``, then an answer drawn as the
    call starts from ``lookups["urn"]``, ``[False answers, calls]`` of the epoch, set by the
    check: no record is withdrawn before its call, and no place in the epoch either) and
    ``decode`` (``record / 2``, exact in float32); ``reads["returned"]`` and
    ``lookups["answers"]`` map each record to its index and its answer;
    ``reads`` and ``lookups`` count their calls (``waiting_stage``)."""
    tf = _tf()
    reads.setdefault("returned", {})
    lookups.setdefault("answers", {})
    lookups.setdefault("urn", [0, 0])  # [answers False left, calls left]: set every epoch

    def read_one(index: int, _number: int) -> Any:
        record = 3 * index + 1 + 4096 * int(draw.integers(1, 2048))  # below 2**23
        reads["returned"][record] = index
        return np.int64(record)

    def ask(record: int, _number: int) -> Any:  # drawn from an urn as the call starts
        left, calls = lookups["urn"]
        current = calls <= 0 or draw.random() >= left / calls
        lookups["urn"] = [left - (not current), calls - 1]
        lookups["answers"][record] = current
        return np.bool_(current)

    read = waiting_stage(seconds, reads, overlapped_from, read_one, tf.int64)
    is_current = waiting_stage(seconds, lookups, overlapped_from, ask, tf.bool)

    def decode(record: Any) -> Any:
        return tf.cast(record, tf.float32) / 2.0

    return read, is_current, decode


def records_problem(values: np.ndarray, reads: dict[str, Any], lookups: dict[str, Any]
                    ) -> str | None:
    """Whether the elements ``values`` (decoded) are the records read returned in the epoch
    counted that is_current answered True for, each once, and every record read was asked
    about: read's output, kept or dropped on is_current's answer for that very record."""
    returned, answers = reads["returned"], lookups["answers"]
    unread = [record for record in answers if record not in returned]
    if unread:
        return (f"is_current was asked about {len(unread)} record(s) that read never returned "
                f"in this epoch (e.g. {unread[0]}): the check's read draws part of every "
                "record on each call, so a record computed from its index is none of them; "
                "ask about read's output")
    records = [int(value) for value in np.round(np.asarray(values, np.float64) * 2)]
    foreign = [record for record in records if record not in returned]
    if foreign:
        return (f"{len(foreign)} of your {len(records)} elements are not decode(record) of a "
                "record read returned in this epoch (the check's read draws part of every "
                "record on each call: a record computed from its index, or decoded by a "
                "formula of your own, is none of them): keep read's output")
    dropped = sum(not answers.get(record, True) for record in records)
    current = sorted(record for record, answer in answers.items() if answer)
    if dropped or sorted(records) != current:
        return (f"your elements do not follow is_current's answers: {dropped} record(s) it "
                f"answered False for came out, and {len(set(current) - set(records))} it "
                "answered True for are missing (its answers are drawn as each call starts: "
                "no set of withdrawn records exists beforehand; keep a record exactly when "
                "is_current answered True for it)")
    return None
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
                    advice: str, alone: float = 1.0) -> str | None:
    """Whether ``most`` or more calls of a stage waited at once in the epoch counted,
    ``share`` of them or more started with ``most // 2`` or more waiting, and at most
    ``alone`` of them started with no other waiting, as the one before them had (in turn)."""
    overlapped = calls["most_at_once"]
    started = calls["overlapped"] / max(calls["count"], 1)
    single = calls["alone"] / max(calls["count"], 1)
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
    if single > alone:
        return (f"{single:.0%} of the epoch's {name}s started with no other {name} waiting, "
                f"as the one before them had (one after another, in turn; at most "
                f"{alone:.0%} may; {overlapped} at once at most): part of the epoch still "
                f"waits one {name} at a time. Which step calls them there, and can it call "
                "several at once?")
    return None
