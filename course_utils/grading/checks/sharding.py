"""Checking a distributed dataset: an epoch's steps under a strategy, and each worker's shard.

Lesson 02's exercise 4 (``distribute(strategy, examples, global_batch_size)``) is graded with
these: on one machine every ``InputContext`` has one input pipeline, so :class:`TwoWorkers`
stands in for a two-worker cluster to show a forgotten ``shard``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.grading.checks.shuffle_order import global_seed
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["TwoWorkers", "WorkerProcesses", "batches", "coverage_problem", "epoch_verifier",
           "most_places_early", "order_problem", "shard_sizes", "steps_on", "workers_verifier"]

#: The largest round shuffle buffer a learner might type (10,000 in TensorFlow's distributed
#: tutorials, 60,000 in its MNIST ones, 2**16, 100,000): the check's shards are drawn so large
#: that each of these, under 0.6 of a shard (``order_problem``'s bound), fails; only a buffer
#: that follows the shard's size (or one larger than any shard) passes.
ROUND_BUFFER = 100_000


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


def shard_sizes(rng: Any) -> tuple[int, int]:
    """The examples of two workers and a per-replica batch for them: each worker's shard holds
    more than ``ROUND_BUFFER`` / 0.6 examples, so that a fixed buffer of ``ROUND_BUFFER`` or
    less shuffles no more than 0.6 of it; batches of 200 or so keep an epoch to few reads."""
    smallest = int(ROUND_BUFFER / 0.6) + 1
    return 2 * rng.randint(smallest, smallest + 20_000) + rng.randint(0, 1), rng.randint(150, 250)


def batches(dataset: Any) -> list[list[int]]:
    """A dataset's batches, as lists of example numbers."""
    return [batch.numpy().ravel().tolist() for batch in dataset]


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


class WorkerProcesses(TwoWorkers):
    """Two workers as two processes would build them: each seeds TensorFlow its own way.

    A worker script seeds its process (or leaves it unseeded); processes seeded alike give the
    same shuffle, but nothing makes the workers agree. So each call of ``dataset_fn`` runs after
    ``tf.random.set_seed`` with a seed of its own, and each pipeline is read for two epochs.
    Worker 0's pipeline is built once more, in a "process" seeded with the third seed: a
    pipeline that seeds TensorFlow itself (and so makes the workers agree where real processes
    would not be made to) gives the same order there; and the global seed is read back after
    each call, so a pipeline that sets any seed of its own is seen (``seed_changed``).
    """

    def __init__(self, replicas_per_worker: int, seeds: tuple[int, int, int]) -> None:
        super().__init__(replicas_per_worker)
        self.seeds = seeds
        self.reseeded: Any = None
        self.seed_changed = False  # did a dataset_fn set TensorFlow's global seed itself?

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        tf = _tf()
        pipelines = []
        for worker, seed in zip((0, 1, 0), self.seeds, strict=True):
            tf.random.set_seed(seed)
            pipelines.append(dataset_fn(tf.distribute.InputContext(
                2, worker, self.num_replicas_in_sync)))
            if global_seed() != seed:  # the process's, not ours
                self.seed_changed = True
        self.reseeded = pipelines.pop()
        return pipelines


def most_places_early(order: list[int]) -> int:
    """The most places any example came out before its place in sorted order."""
    ranks = {value: rank for rank, value in enumerate(sorted(order))}
    return max(ranks[value] - position for position, value in enumerate(order))


def order_problem(epochs: list[list[list[int]]], worker: int) -> str | None:
    """What is wrong with one worker's two epochs of batches as a shuffle, or None."""
    import numpy as np

    first, second = ([v for batch in epoch for v in batch] for epoch in epochs)
    ranks = {value: rank for rank, value in enumerate(sorted(first))}
    moved = float(np.mean([abs(position - ranks[v]) for position, v in enumerate(first)]))
    if moved < len(first) / 5:  # a whole shuffle: about n/3, give or take n/35
        return (f"worker {worker}'s {len(first)} examples moved {moved:.1f} places on average "
                f"from their order; a shuffle of the whole shard moves them about "
                f"{len(first) / 3:.0f}: shuffle the shard with a buffer as large as the shard")
    # A buffer of b holds the next b examples: none comes out more than b - 1 places early.
    # A whole shuffle sends some example of the shard's last 40 % to its first places: of
    # 20,000 permutations of 320 drawn here, none brought an example less than 0.76 n early.
    early = max(most_places_early([v for batch in epoch for v in batch]) for epoch in epochs)
    if early < 0.6 * len(first):
        return (f"no example of worker {worker}'s shard of {len(first)} came out more than "
                f"{early} places before its place in the shard, in either epoch; a shuffle "
                f"of the whole shard brings some of its last 40 % to the front: a buffer "
                f"smaller than the shard ({early + 1} or so) – use the shard's size")
    whole = sum(sorted(ranks[v] for v in batch) == list(
        range(min(ranks[v] for v in batch), min(ranks[v] for v in batch) + len(batch)))
        for batch in epochs[0] if len(batch) > 1)
    if whole > len(epochs[0]) / 2:
        return (f"{whole} of worker {worker}'s {len(epochs[0])} batches are runs of "
                "neighbouring examples: you shuffled whole batches (lesson 01); shuffle the "
                "examples, then batch")
    # Shuffled in blocks (batch(k), shuffle, unbatch): an example's neighbour in the shard
    # follows it (k - 1)/k of the time; a shuffle of the examples, about 1 in n (n > 100,000
    # here). Blocks cut into batches across two blocks passed the count of whole batches
    # (nb33-02, blocks of 2 to a batch, 4 of 4)
    after = float(np.mean([ranks[b] == ranks[a] + 1 for a, b in zip(first[:-1], first[1:],
                                                                   strict=True)]))
    if after > 0.01:
        return (f"in worker {worker}'s epoch, {after:.0%} of its examples are followed by "
                "their neighbour in the shard (a shuffle of the examples: about 1 in "
                f"{len(first):,}): you shuffled blocks of neighbouring examples (batches, "
                "lesson 01); shuffle the examples themselves, then batch")
    if first == second:
        return (f"worker {worker} gave its examples in the same order in both epochs: "
                "reshuffle every epoch")
    return None
