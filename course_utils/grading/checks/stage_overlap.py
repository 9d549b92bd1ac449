"""Lesson 00, exercise 4 (a pipeline with two slow stages): the check's ``read`` (of a batch
of records in one call, a wait per record) and ``augment`` (a wait per batch), which record the
calls they start, and one training epoch on the dataset as returned (tf.data's default options)
that counts what ran side by side – calls in flight, not seconds.

Three counts, each a mechanism that a pipeline either has or lacks, whatever the machine's load:

* *stages*: of the augment calls on every batch but the last, those during which a read of a
  later batch was in flight (running when the augment began, or started before it ended), as
  the lesson's cell counts them. Reads and augments pulled by one thread (the colleague's
  pipeline: one prefetch at its end, no default rewrite reaching its maps of
  ``tf.py_function``) run one after the other: none, even where that thread reads a batch
  ahead (a ``scan``), which ends the read before the augment begins.
* *augment*: of the training steps but the last, those by whose end the next batch's augment
  had started (in flight or done). An augment pulled by the training loop itself runs between
  steps: none (tf.data's default ``inject_prefetch`` adds a prefetch after a last synchronous
  ``map``, so a pipeline that leaves it out still has one).
* *reads*: of the steps that began with records left unread, those during which a read was
  in flight (running as the step began, or started before it ended: a read that the step's own
  pull of its batch started a moment before counts). A pipeline that read every record before
  the first step has no such step; one that reads inside the pull, none in flight.

Each epoch timed runs the pipeline's functions on a private pool of ``RUNNER_THREADS`` threads,
whatever the machine's cores, so that AUTOTUNE's parallelism is the same everywhere.

A count that comes out short waits a little (``GRACE_S``, ``GRACE_STEPS`` times an epoch at most)
for the call a busy machine started late: a pipeline without the mechanism never starts it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.grading.checks.batch_shapes import py_function_token

__all__ = ["GRACE_S", "MIN_SHARE", "STEP_WAIT_S", "StageCalls", "batches_problem",
           "draw_waits", "epoch_summary", "expected_batches", "overlap_problem", "tampered",
           "train_epoch"]

#: The check's training step (seconds); a short grace for calls a busy machine starts late.
STEP_WAIT_S, GRACE_S, GRACE_STEPS = 0.016, 0.016, 8
#: The share of the counted calls or steps that each count needs.
MIN_SHARE = 0.5
#: The threads that run the pipeline's functions in the epochs timed (its private pool): the
#: machine the waits were tuned on. tf.data's AUTOTUNE starts a parallel map at the smaller of
#: 16 and the pool's size, so on a 16-core machine a parallel read (which the exercise accepts)
#: read all ~11 batches at once before the first augment: nothing left to overlap (xf00 R1).
RUNNER_THREADS = 2


def draw_waits(rng: Any) -> dict[str, Any]:
    """Fresh sizes and waits: a batch's reads and the augment each shorter than the step plus
    the other (so that overlapping them pays), read and augment together longer than the step
    by at least a quarter (so that one prefetch at the end leaves the loop waiting)."""
    batch_size = rng.randint(3, 5)
    read_batch_s = STEP_WAIT_S * rng.uniform(0.8, 1.1)
    return {"first": rng.randint(0, 1000), "batch_size": batch_size,
            "count": rng.randint(9, 11) * batch_size + rng.randint(1, batch_size - 1),
            "read_s": read_batch_s / batch_size,
            "augment_s": STEP_WAIT_S * rng.uniform(0.45, 0.7)}


def expected_batches(first: int, count: int, batch_size: int) -> list[np.ndarray]:
    """What the colleague's pipeline makes: ``read`` gives ``7x + 3`` for each record ``x`` of a
    batch, ``augment`` reverses a batch and adds 1."""
    read = 7 * np.arange(first, first + count) + 3
    return [read[start:start + batch_size][::-1] + 1 for start in range(0, count, batch_size)]


def _wait(ready: Callable[[], bool], seconds: float) -> float:
    """Wait until ``ready()`` or ``seconds`` have passed; the seconds waited."""
    start = time.perf_counter()
    while not ready() and time.perf_counter() - start < seconds:
        time.sleep(0.0005)
    return time.perf_counter() - start


class StageCalls:
    """The check's ``read`` and ``augment`` for one case, and what their calls did: the records
    whose read started, the batches whose augment started, every call's op (``by``: an index
    into ``ops``, the py_function tokens of every op traced, None for an eager call)."""

    def __init__(self, waits: dict[str, Any]) -> None:
        from course_utils.quiet import import_tensorflow

        self.tf, self.waits, self.lock = import_tensorflow(), waits, threading.Lock()
        self.ops: list[str | None] = []
        self.reset(grace_s=0.0)

    def reset(self, grace_s: float) -> None:
        """Forget the calls so far; ``grace_s``: how long an augment waits for a later read."""
        self.read_started: set[int] = set()
        self.augment_started: set[int] = set()
        self.starts, self.reads, self.augments = 0, 0, 0
        self.by: list[int] = []
        self.stages: list[bool] = []  # per augment but the last: a later read in flight
        self.in_flight: list[int] = []  # the last record of each read running
        self.read_log: list[int] = []  # the last record of each read started, in turn
        self.grace_s, self.budget, self.waited = grace_s, GRACE_STEPS * grace_s, 0.0

    def _op(self, tensor_of: Callable[[int], Any]) -> Any:
        with self.lock:
            op = len(self.ops)
            self.ops.append(None)
        tensor = tensor_of(op)
        self.ops[op] = py_function_token(tensor)
        return tensor

    def _slack(self, ready: Callable[[], bool]) -> None:
        slack = _wait(ready, min(self.grace_s, self.budget))
        self.budget, self.waited = self.budget - slack, self.waited + slack

    def _read(self, values: Any, op: int) -> Any:
        values = np.asarray(values, dtype=np.int64)
        records = [int(value) - self.waits["first"] for value in values.reshape(-1)]
        last = max(records, default=-1)
        with self.lock:
            self.read_started.update(records)
            self.starts, self.reads = self.starts + 1, self.reads + 1
            self.by.append(op)
            self.in_flight.append(last)
            self.read_log.append(last)
        try:
            time.sleep(self.waits["read_s"] * values.size)  # a wait per record read
        finally:
            with self.lock:
                self.in_flight.remove(last)
        return 7 * values + 3

    def _augment(self, values: Any, op: int) -> Any:
        values = np.asarray(values)
        size, count = self.waits["batch_size"], self.waits["count"]
        records = (values.reshape(-1) - 3) // 7 - self.waits["first"]
        batch = int(records.min()) // size if records.size else -1
        later = (batch + 1) * size  # the first record of the next batch
        with self.lock:
            self.augment_started.add(batch)
            self.augments += 1
            self.by.append(op)
            running = any(last >= later for last in self.in_flight)  # as the augment begins
            seen = len(self.read_log)
        time.sleep(self.waits["augment_s"])
        if 0 <= batch and later < count:
            def beside() -> bool:  # a later read in flight at some moment of the augment
                return running or any(last >= later for last in self.read_log[seen:])
            if not beside():  # a read that a busy machine started late: this thread waits,
                self._slack(beside)  # so a pipeline that pulls both in it never starts one
            self.stages.append(beside())
        return np.flip(values) + 1

    def read(self, indices: Any) -> Any:
        """The records ``indices`` (a batch of them), read in one call: ``7 * index + 3``,
        after a wait per record."""
        tf = self.tf

        def made(op: int) -> Any:
            records = tf.py_function(lambda values: self._read(values, op), [indices],
                                     tf.int64)
            records.set_shape(indices.shape)
            return records
        return self._op(made)

    def augment(self, batch: Any) -> Any:
        """The batch augmented (reversed, plus 1), after a wait."""
        tf = self.tf

        def made(op: int) -> Any:
            out = tf.py_function(lambda values: self._augment(values, op), [batch], tf.int64)
            out.set_shape(batch.shape)
            return out
        return self._op(made)

    def functions(self) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """``read`` and ``augment`` as plain functions, the ones an answer gets: a bound
        method's ``__self__`` would hand it this recorder."""
        def read(indices: Any) -> Any:
            return self.read(indices)

        def augment(batch: Any) -> Any:
            return self.augment(batch)
        read.__doc__, augment.__doc__ = StageCalls.read.__doc__, StageCalls.augment.__doc__
        return read, augment


#: The recorder's own methods and the types of its attributes: what ``tampered`` compares.
_OWN_METHODS = dict(vars(StageCalls))
_KINDS = {"tf": type(np), "waits": dict, "lock": type(threading.Lock()), "ops": list,
          "read_started": set, "augment_started": set, "starts": int, "reads": int,
          "augments": int, "by": list, "stages": list, "grace_s": float, "budget": float,
          "waited": float, "in_flight": list, "read_log": list}


def tampered(calls: Any, waits: dict[str, Any]) -> str | None:
    """What was changed in the check's recorder (its class, its methods, an attribute or its
    type, the waits drawn: ``waits``, a copy), or None: its counts are read only when None."""
    if type(calls) is not StageCalls or dict(vars(StageCalls)) != _OWN_METHODS:
        changed = ["its class or methods"]
    else:
        fields = vars(calls)
        changed = sorted(set(fields) ^ set(_KINDS)) or [
            name for name, kind in _KINDS.items() if type(fields[name]) is not kind]
        if not changed and fields["waits"] != waits:
            changed = ["waits"]
        if not changed and any(type(stage) is not bool for stage in fields["stages"]):
            changed = ["stages"]
    if not changed:
        return None
    return (f"the check's recorder of read and augment was changed ({', '.join(changed)}): "
            "a pipeline calls read and augment, it does not rewrite what they record")


def train_epoch(dataset: Any, calls: StageCalls,
                grace_s: float = 0.0) -> tuple[dict[str, float], float, list[np.ndarray]]:
    """One epoch with a ``STEP_WAIT_S`` step per batch: the three shares (module docstring),
    the seconds the epoch took (the check's waits for late calls among them, their sum in
    ``calls.waited``), the batches."""
    calls.reset(grace_s)
    size, count = calls.waits["batch_size"], calls.waits["count"]
    last = -(-count // size) - 1
    augment, reads, batches = [], [], []
    options = calls.tf.data.Options()  # AUTOTUNE's parallelism and the calls run at once:
    options.threading.private_threadpool_size = RUNNER_THREADS  # as on the 2-core machine
    start = time.perf_counter()
    for step, batch in enumerate(dataset.with_options(options)):
        batches.append(np.asarray(batch))
        with calls.lock:  # a read the step's pull started may be running as the step begins
            unread = len(calls.read_started) < count
            starts, running = calls.starts, bool(calls.in_flight)
        time.sleep(STEP_WAIT_S)  # the training step
        if step < last:  # was the next batch's augment started by its end?
            calls._slack(lambda n=step + 1: n in calls.augment_started)
            augment.append(step + 1 in calls.augment_started)
        if unread:  # was a read in flight while it ran (running as it began, or started)?
            if not running:
                calls._slack(lambda n=starts: calls.starts > n)
            reads.append(running or calls.starts > starts)
    seconds = time.perf_counter() - start
    shares = {"stages": float(np.mean(calls.stages)) if calls.stages else 0.0,
              "augment": float(np.mean(augment)) if augment else 0.0,
              "reads": float(np.mean(reads)) if reads else 0.0}
    return shares, seconds, batches


def overlap_problem(shares: dict[str, float]) -> str | None:
    """What the three shares say is not overlapped, or None (the stages first, then the
    augment, then the reads: a pipeline without a mechanism fails on the first it lacks)."""
    need = f"at least {MIN_SHARE:.0%} needed; tf.data's default options"
    if shares["stages"] < MIN_SHARE:
        return (f"read and augment run one after the other: a read of a later batch was in "
                f"flight during only {shares['stages']:.0%} of the augments ({need}); a read "
                "that ended before the augment began is not beside it. Together they are one "
                "stage, slower than the step; what lets the reads of the next batch run while "
                "this one is augmented?")
    if shares["augment"] < MIN_SHARE:
        return (f"augment does not overlap the training step: the next batch's augment had "
                f"started by the end of only {shares['augment']:.0%} of the steps ({need}). "
                "Does the training loop itself pull the augment?")
    if shares["reads"] < MIN_SHARE:
        return (f"reading does not overlap the training step: a read was in flight during only "
                f"{shares['reads']:.0%} of the steps that began with records left unread "
                f"({need}). Did every read run before the first step, or only when the step "
                "asked for a batch?")
    return None


def batches_problem(got: list[np.ndarray], expected: list[np.ndarray]) -> str | None:
    """What is wrong with one epoch's batches against the ``expected`` ones, or None."""
    sizes = [np.shape(batch) for batch in got]
    want = [np.shape(batch) for batch in expected]
    if sizes != want:
        return f"expected batches of shapes {want}, got {sizes}"
    if not all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)):
        return ("the elements differ from the colleague's pipeline's, or came in another "
                "order: batch the records, read each batch, augment it (nothing skipped)")
    return None


def epoch_summary(shares: dict[str, float], seconds: float, waited: float,
                  colleague_s: float, waits: dict[str, Any]) -> str:
    """The line a passing answer is shown: its three shares, its epoch's seconds beside the
    colleague's pipeline's (measured), and the speed-up computed from the waits (not measured):
    a step of the larger of read + augment and the step, against the largest of the three."""
    read_s = waits["batch_size"] * waits["read_s"]
    ideal = (max(read_s + waits["augment_s"], STEP_WAIT_S)
             / max(read_s, waits["augment_s"], STEP_WAIT_S))
    return (f"   reads overlapped augments in {shares['stages']:.0%}, augments the step in "
            f"{shares['augment']:.0%}, reads the step in {shares['reads']:.0%} (of those "
            f"counted); an epoch took {seconds:.2f} s ({waited:.2f} s of it waiting for late "
            f"calls), the colleague's {colleague_s:.2f} s: ×{colleague_s / seconds:.2f} "
            f"measured; about ×{ideal:.2f} computed from the waits for an idle machine")
