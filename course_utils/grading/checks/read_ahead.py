"""Lesson 00, exercise 4 (a prefetch that overlaps nothing): one training epoch of a pipeline
whose reads and steps wait, and what it overlapped; its batches against the broken pipeline's."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["BATCH_SIZE", "MIN_READ_AHEAD_SHARE", "READ_WAIT_S", "STEP_WAIT_S", "batches_problem",
           "train_epoch"]


#: Per-element read and per-batch step waits in ``check_overlapped_pipeline`` (seconds).
READ_WAIT_S, BATCH_SIZE, STEP_WAIT_S = 0.004, 4, 0.016
#: The share of training steps during which at least half a batch of later records must be read.
MIN_READ_AHEAD_SHARE = 0.2


def train_epoch(dataset: Any, reads: dict[str, Any], count: int
                ) -> tuple[float, float, list[np.ndarray]]:
    """One epoch of ``count`` elements with a ``STEP_WAIT_S`` step per batch: (the share, in
    [0, 1], of the steps while which at least half a batch of later records (``BATCH_SIZE //
    2``) was read, of those after which that many are left, seconds, the batches). One record
    read ahead per step (a ``prefetch(1)`` before the batch) overlaps a quarter of the reads
    and counts no step; reads that all ran before the first step (a pipeline that reads
    everything up front) overlap no step either."""
    reads["done"], reads["calls"], reads["by"] = set(), 0, []
    consumed, read_ahead, batches = 0, [], []
    start = time.perf_counter()
    for batch in dataset:
        batches.append(batch)
        consumed += len(batch) if np.ndim(batch) else 1  # an element unbatched: one
        before = len(reads["done"])
        time.sleep(STEP_WAIT_S)  # the training step
        if count - consumed >= BATCH_SIZE // 2:  # were half a batch read while it ran?
            read_ahead.append(len(reads["done"]) - max(before, consumed) >= BATCH_SIZE // 2)
    seconds = time.perf_counter() - start
    return (sum(read_ahead) / max(len(read_ahead), 1), seconds,
            [np.asarray(batch) for batch in batches])


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
