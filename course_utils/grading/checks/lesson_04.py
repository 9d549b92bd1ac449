"""Checks of lesson 04's exercises (registered by name with ``@register``).

* ``check_run_steps(run_steps, strategy)``: on the notebook's ``ParameterServerStrategy`` (a check
  cannot start a second in-process cluster), the learner's coordinator loop runs a step that
  counts itself in a variable on a parameter server; when it returns, the variable must hold
  exactly the number of steps asked for, and the list of fetched losses must have one per step.
* ``check_embedding_partitioner(embedding_partitioner)``: the partitioner made for ``num_ps``
  parameter servers splits fresh random shapes like ``MinSizePartitioner(256 KiB, num_ps)``:
  large embeddings over the parameter servers, small variables whole.
* ``check_build_cluster_spec(build_cluster_spec)``: the ``tf.train.ClusterSpec`` of a described
  between-graph cluster (``ps`` and ``worker`` jobs, ``host:port`` in the given order).
"""

from __future__ import annotations

from typing import Any

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = [
    "MIN_SHARD_BYTES",
    "check_build_cluster_spec",
    "check_embedding_partitioner",
    "check_run_steps",
    "shard_rows",
]

#: The smallest shard the partitioner exercise allows (256 KiB).
MIN_SHARD_BYTES = 256 << 10


def shard_rows(rows: int, num_shards: int) -> list[int]:
    """The rows of each shard when ``rows`` are split in ``num_shards`` (as ShardedVariable)."""
    base, extra = divmod(rows, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


@register
def check_run_steps(fn: Any, strategy: Any) -> bool:
    """Check ``run_steps(coordinator, step_fn, iterator, num_steps)`` on the notebook's cluster."""
    tf = _tf()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # the notebook's own
    with strategy.scope():
        applied = tf.Variable(0, dtype=tf.int64, name="check_applied_steps")

    def dataset_fn() -> Any:
        return tf.data.Dataset.range(1_000_000).map(lambda i: tf.cast(i, tf.float32))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step_fn(iterator: Any) -> Any:
        applied.assign_add(1)
        return next(iterator) * 0.0 + 1.0  # a "loss" of 1.0 per step

    rng = fresh_rng()

    def case(num_steps: int) -> Case:
        def verify(got: Any) -> str | None:
            done = int(applied.numpy())  # read at once: a loop without join is still running
            applied.assign(0)
            if done != num_steps:
                return (f"{done} steps were applied when run_steps returned, {num_steps} "
                        "asked for: schedule every step, then coordinator.join() before "
                        "returning")
            if got is None or len(got) != num_steps:
                return f"return one loss per step ({num_steps}), got {got!r:.80}"
            if not all(isinstance(value, (int, float)) or hasattr(value, "dtype")
                       for value in got) or not all(float(value) == 1.0 for value in got):
                return "return the fetched losses (remote_value.fetch()), not the RemoteValues"
            return None

        return Case(args=(coordinator, step_fn, iterator, num_steps), verify=verify,
                    label=f"(coordinator, step_fn, iterator, num_steps={num_steps})")

    cases = [case(rng.randint(3, 12)) for _ in range(2)]
    return run_check("run_steps", fn, cases,
                     hint="lesson 04, section 2: coordinator.schedule(step_fn, args=(iterator,)) "
                          "for each step, coordinator.join(), then fetch() every RemoteValue.")


@register
def check_embedding_partitioner(fn: Any) -> bool:
    """Check ``embedding_partitioner(num_ps)``: shards of at least 256 KiB, at most one per ps."""
    tf = _tf()
    rng = fresh_rng()
    cases = []
    for _ in range(3):
        num_ps = rng.randint(2, 6)
        dim = rng.choice([8, 16, 32, 64])
        shapes = [(rng.randint(100_000, 2_000_000), dim), (rng.randint(1, 2000), dim), (dim,)]
        reference = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=MIN_SHARD_BYTES, max_shards=num_ps)

        def verify(partitioner: Any, num_ps: int = num_ps, shapes: Any = shapes,
                   reference: Any = reference) -> str | None:
            if not callable(partitioner):
                return f"return a partitioner (a callable), got {partitioner!r:.80}"
            for shape in shapes:
                expected = list(reference(tf.TensorShape(shape), tf.float32))
                got = list(partitioner(tf.TensorShape(shape), tf.float32))
                if got != expected:
                    size = 4 * int(tf.TensorShape(shape).num_elements()) / 1024
                    return (f"a float32 variable of shape {list(shape)} ({size:.0f} KiB) on "
                            f"{num_ps} ps: expected {expected[0]} shards of "
                            f"{shard_rows(shape[0], expected[0])} rows, got {got}")
            return None

        cases.append(Case(args=(num_ps,), verify=verify, label=f"(num_ps={num_ps})"))
    return run_check("embedding_partitioner", fn, cases,
                     hint="lesson 04, section 3: MinSizePartitioner(min_shard_bytes=..., "
                          "max_shards=...) splits only what is large.")


@register
def check_build_cluster_spec(fn: Any) -> bool:
    """Check ``build_cluster_spec(ps_hosts, worker_hosts, port)``: a between-graph ClusterSpec."""
    tf = _tf()
    rng = fresh_rng()
    cases = []
    for _ in range(3):
        ps_hosts = [f"ps{i}.{rng.choice(['rack-a', 'rack-b'])}.internal"
                    for i in range(rng.randint(1, 3))]
        worker_hosts = [f"worker{i}.internal" for i in rng.sample(range(20), rng.randint(2, 5))]
        port = rng.randint(2000, 9000)
        expected = {"ps": [f"{h}:{port}" for h in ps_hosts],
                    "worker": [f"{h}:{port}" for h in worker_hosts]}

        def verify(got: Any, expected: dict[str, list[str]] = expected) -> str | None:
            if not isinstance(got, tf.train.ClusterSpec):
                return f"return a tf.train.ClusterSpec, got {type(got).__name__}"
            if got.as_dict() != expected:
                return f"expected the jobs {expected}, got {got.as_dict()}"
            return None

        cases.append(Case(args=(ps_hosts, worker_hosts, port), verify=verify))
    return run_check("build_cluster_spec", fn, cases,
                     hint="lesson 04, section 1: tf.train.ClusterSpec({'ps': [...], 'worker': "
                          "[...]}) with 'host:port' strings, in the order given.")
