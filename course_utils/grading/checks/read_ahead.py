"""Lesson 00, exercise 4 (a prefetch that overlaps nothing): one training epoch of a pipeline
whose reads and steps wait, and what it overlapped; its batches against the broken pipeline's.

Still passes: a reader that has the next record read at the end of every step, from the first
on (a ``prefetch(1)`` before the batch does), and reads half a batch ahead during only a
fifth to two fifths of the steps (a ``batch`` then a two-way parallel ``interleave`` of its
batches: 14-38 % of the steps, 24 of 26 runs passed, those under a fifth refused; on an idle
machine no faster than the broken pipeline): such a reader is more work than the fix, and a
bar well under what right answers reach with both cores busy (half a batch ahead during 57 %
to 100 % of the steps) keeps them passing under heavier load."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BATCH_SIZE", "GRACE_S", "MIN_READ_AHEAD_SHARE", "READ_WAIT_S", "STEP_WAIT_S",
           "batches_problem", "epoch_summary", "overlap_problem", "train_epoch"]


#: Per-element read and per-batch step waits in ``check_overlapped_pipeline`` (seconds).
READ_WAIT_S, BATCH_SIZE, STEP_WAIT_S = 0.004, 4, 0.016
#: How much longer a step waits, at most, for reads late on a busy machine (for half a batch:
#: ``GRACE_STEPS`` times an epoch).
GRACE_S, GRACE_STEPS = 3 * STEP_WAIT_S, 6
#: The share of training steps during which at least half a batch of later records must be read.
MIN_READ_AHEAD_SHARE = 0.2


def _wait(ready: Callable[[], bool], seconds: float) -> float:
    """Wait until ``ready()`` or ``seconds`` have passed; the seconds waited."""
    start = time.perf_counter()
    while not ready() and time.perf_counter() - start < seconds:
        time.sleep(0.001)
    return time.perf_counter() - start


def train_epoch(dataset: Any, reads: dict[str, Any], first: int, count: int,
                grace_s: float = 0.0) -> tuple[float, list[int], float, list[np.ndarray]]:
    """One epoch of records ``first`` to ``first + count - 1`` with a ``STEP_WAIT_S`` step per
    batch: (the share, in [0, 1], of the steps while which at least half a batch of later
    records (``BATCH_SIZE // 2``) was read, of those after which that many are left; the steps
    (from 1) at whose end, with records left, the next record had not been read; the seconds
    the epoch took, the check's waits included (their sum in ``reads["waited"]``); the
    batches). A step whose reads are late (a busy machine) waits up to ``grace_s`` longer for
    them (half a batch: ``GRACE_STEPS`` times an epoch; the next record: until two steps have
    not read it: a prefetch or a parallel map, a reader that runs ahead all epoch, has read it
    by then). One record read ahead per step (a ``prefetch(1)`` before the batch) overlaps a
    quarter of the reads and counts no step; reads that all ran before the first step (a
    pipeline that reads everything up front) overlap no step either."""
    reads["done"], reads["calls"], reads["by"] = set(), 0, []
    done, half, budget = reads["done"], BATCH_SIZE // 2, GRACE_STEPS * grace_s
    consumed, read_ahead, idle, batches, waited = 0, [], [], [], 0.0
    start = time.perf_counter()
    for batch in dataset:
        batches.append(batch)
        consumed += len(batch) if np.ndim(batch) else 1  # an element unbatched: one
        ahead = max(len(done), consumed)  # records read when the step begins
        time.sleep(STEP_WAIT_S)  # the training step
        if consumed < count:  # records left: was the next one read by its end?
            waited += _wait(lambda n=first + consumed: n in done, grace_s * (len(idle) < 2))
            if first + consumed not in done:
                idle.append(len(batches))
        if count - consumed >= half:  # were half a batch read while it ran?
            if len(done) > consumed and ahead + half <= count:  # reads that may still come
                slack = _wait(lambda n=ahead + half: len(done) >= n, min(grace_s, budget))
                budget, waited = budget - slack, waited + slack
            read_ahead.append(len(done) - ahead >= half)
    seconds, reads["waited"] = time.perf_counter() - start, waited
    return (sum(read_ahead) / max(len(read_ahead), 1), idle, seconds,
            [np.asarray(batch) for batch in batches])


def overlap_problem(share: float, idle: list[int]) -> str | None:
    """What ``train_epoch``'s share and steps without a read ahead say is wrong, or None."""
    if share < MIN_READ_AHEAD_SHARE:
        return (f"reading overlaps too little of the step: half a batch or more of the "
                f"later records ({BATCH_SIZE // 2} of {BATCH_SIZE}) was read during only "
                f"{share:.0%} of the training steps, fewer during the others (half a batch "
                f"during at least {MIN_READ_AHEAD_SHARE:.0%} needed; tf.data's automatic "
                "rewrites off)")
    if idle:  # a reader ahead for part of the epoch only (a part of the records without one)
        return (f"reading stops overlapping the step part of the way: at the end of step "
                f"{idle[0]}, with records left, the next record had not been read ahead (a "
                "reader that runs ahead, a prefetch or a parallel map, reads it during a "
                "step): does every part of your pipeline's records pass one?")
    return None


def batches_problem(batches: list[np.ndarray], expected: np.ndarray) -> str | None:
    """What is wrong with one epoch's batches against the ``expected`` elements, in order, in
    batches of ``BATCH_SIZE`` (a short last one), or None."""
    sizes = [len(batch) if np.ndim(batch) == 1 else np.shape(batch) for batch in batches]
    count = len(expected)
    want = [BATCH_SIZE] * (count // BATCH_SIZE) + [count % BATCH_SIZE]
    if sizes != want:
        return f"expected batches of sizes {want}, got {sizes}"
    if not np.array_equal(np.concatenate(batches), expected):
        return "the elements differ from the broken pipeline's, or came in another order"
    return None


def epoch_summary(share: float, seconds: float, waited: float, broken_s: float,
                  count: int) -> str:
    """The line a passing answer is shown: its share of steps with half a batch read during
    them, its epoch's seconds (the check's waits for late reads among them) beside the broken
    pipeline's (the speed-up measured), and, said to be computed, not measured, the speed-up
    of the fix (a prefetch after the batch) for ``count`` records on an idle machine (reads
    and steps overlapped from the second batch on: the first batch's reads, one at a time,
    overlap no step; other right answers, a parallel map, may show less)."""
    read_s, steps = BATCH_SIZE * READ_WAIT_S, -(-count // BATCH_SIZE)  # a batch's reads
    broken_idle = count * READ_WAIT_S + steps * STEP_WAIT_S
    best = broken_idle / (read_s + steps * max(read_s, STEP_WAIT_S))
    return (f"   half a batch or more was read during {share:.0%} of the steps; an epoch of "
            f"your pipeline took {seconds:.2f} s ({waited:.2f} s of it waiting for late "
            f"reads), the broken one {broken_s:.2f} s: ×{broken_s / seconds:.2f} measured. "
            f"For comparison, computed from the waits, not measured: about ×{best:.1f} for "
            "the fix with a prefetch after the batch on an idle machine, whose first batch's "
            "reads overlap no step (a busy machine's timings vary either way)")
