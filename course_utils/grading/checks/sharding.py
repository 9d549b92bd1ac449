"""Checking a distributed dataset: an epoch's steps under a strategy, and each worker's shard.

Lesson 02's exercise 4 (``distribute(strategy, examples, global_batch_size)``) is graded with
these: on one machine every ``InputContext`` has one input pipeline, so :class:`TwoWorkers`
stands in for a two-worker cluster to show a forgotten ``shard``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["TwoWorkers", "batches", "coverage_problem", "epoch_verifier", "steps_on",
           "workers_verifier"]


class TwoWorkers:
    """A stand-in strategy of two workers: it calls the dataset function once per worker.

    On one machine every ``InputContext`` has one input pipeline, so a forgotten ``shard`` goes
    unnoticed; here each call gets the context a worker of a two-worker cluster would get.
    """

    def __init__(self, replicas_per_worker: int) -> None:
        self.num_replicas_in_sync = 2 * replicas_per_worker

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        tf = _tf()
        return [dataset_fn(tf.distribute.InputContext(2, worker, self.num_replicas_in_sync))
                for worker in (0, 1)]

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        raise AssertionError("build the dataset with strategy.distribute_datasets_from_function"
                             "(dataset_fn), not experimental_distribute_dataset")


def batches(dataset: Any) -> list[list[int]]:
    """A dataset's batches, as lists of example numbers."""
    return [[int(v) for v in batch.numpy().ravel()] for batch in dataset]


def steps_on(strategy: Any, distributed: Any) -> list[list[list[int]]]:
    """Each step's per-replica batches, as lists of example numbers."""
    return [[[int(v) for v in part.numpy().ravel()]
             for part in strategy.experimental_local_results(step)] for step in distributed]


def coverage_problem(seen: list[int], size: int) -> str | None:
    """What is wrong with the examples an epoch gave (repeated, missing), or None."""
    if sorted(seen) == list(range(size)):
        return None
    repeated = len(seen) - len(set(seen))
    missing = size - len(set(seen) & set(range(size)))
    return (f"over the epoch the replicas got {len(seen)} examples of {size}: {repeated} "
            f"repeated, {missing} missing")


def epoch_verifier(size: int, global_batch: int, per_replica: int, replicas: int
                   ) -> Callable[[list[list[list[int]]]], str | None]:
    """A verify function for an epoch's steps (per replica) under a real strategy."""

    def verify_strategy(steps: list[list[list[int]]]) -> str | None:
        problem = coverage_problem([v for step in steps for part in step for v in part], size)
        if problem:
            return problem
        expected_steps = -(-size // global_batch)
        if len(steps) != expected_steps:
            return (f"{size} examples in global batches of {global_batch} make "
                    f"{expected_steps} steps, got {len(steps)}")
        for number, step in enumerate(steps[:-1], start=1):
            if [len(part) for part in step] != [per_replica] * replicas:
                return (f"step {number} gave the replicas {[len(part) for part in step]} "
                        f"examples, expected {per_replica} each (the global batch "
                        f"{global_batch} / {replicas} replicas)")
        return None

    return verify_strategy


def workers_verifier(size: int, per_replica: int) -> Callable[[Any], str | None]:
    """A verify function for the two pipelines :class:`TwoWorkers` got from the learner."""

    def verify_workers(pipelines: Any) -> str | None:
        if not isinstance(pipelines, list) or len(pipelines) != 2:
            return ("return what strategy.distribute_datasets_from_function(dataset_fn) "
                    "returns")
        shards = [sorted(v for batch in batches for v in batch) for batches in pipelines]
        if set(shards[0]) & set(shards[1]):
            return ("both workers read the same examples: shard the dataset with "
                    "input_context.num_input_pipelines and input_context.input_pipeline_id")
        problem = coverage_problem(shards[0] + shards[1], size)
        if problem:
            return problem
        sizes = {len(batch) for batches in pipelines for batch in batches[:-1]}
        if sizes != {per_replica}:
            return (f"a worker's batches held {sorted(sizes)} examples, expected "
                    f"{per_replica}: the per-replica batch size, "
                    "input_context.get_per_replica_batch_size(global_batch_size)")
        return None

    return verify_workers
