"""Batches and datasets as the Trainer sees them: ``(x, y[, sample_weight])``, sizes, epochs.

The data a Trainer gets is a ``tf.data.Dataset`` of global batches, or a function of a
``tf.distribute.InputContext`` that returns a dataset of per-replica batches (``DataLike``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.quiet import import_tensorflow

tf = import_tensorflow()

__all__ = [
    "DataLike",
    "batch_size",
    "concat_batches",
    "count_steps",
    "distribute",
    "element_spec",
    "skip_read_batches",
    "static_batch_size",
    "unpack_batch",
]

DataLike = Any  # a tf.data.Dataset of global batches, or a function InputContext -> Dataset


def unpack_batch(batch: Any) -> tuple[Any, Any, Any]:
    """Split a batch into ``(x, y, sample_weight)``; ``sample_weight`` is None when absent."""
    if isinstance(batch, dict) or not isinstance(batch, (tuple, list)):
        raise ValueError(
            "each batch must be a tuple (x, y) or (x, y, sample_weight), got "
            f"{type(batch).__name__}"
        )
    if len(batch) == 2:
        return batch[0], batch[1], None
    if len(batch) == 3:
        return batch[0], batch[1], batch[2]
    raise ValueError(f"each batch must be (x, y) or (x, y, sample_weight), got {len(batch)} parts")


def batch_size(structure: Any) -> tf.Tensor:
    """The number of examples in a (nested) batch, as a tensor known when the step runs."""
    return tf.shape(tf.nest.flatten(structure)[0])[0]


def static_batch_size(structure: Any) -> int | None:
    """The number of examples in a (nested) batch when the graph fixes it, else None."""
    return tf.nest.flatten(structure)[0].shape[0]


def concat_batches(structures: Sequence[Any]) -> Any:
    """Join batches of the same structure along the batch axis."""
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *structures)


def element_spec(data: DataLike) -> Any:
    """The element spec of a dataset, or of the dataset a dataset function returns."""
    if isinstance(data, tf.data.Dataset):
        return data.element_spec
    if callable(data):
        return data(tf.distribute.InputContext()).element_spec
    raise ValueError(
        "data must be a tf.data.Dataset of global batches (x, y) or a function of a "
        f"tf.distribute.InputContext returning one, got {type(data).__name__}"
    )


def distribute(strategy: tf.distribute.Strategy, data: DataLike) -> Any:
    """The distributed dataset of ``data`` under ``strategy`` (split batches or per replica)."""
    if isinstance(data, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(data)
    return strategy.distribute_datasets_from_function(data)


def skip_read_batches(iterator: Any, steps: int) -> Any:
    """``iterator`` after reading and discarding ``steps`` batches (a resumed run's input).

    ``iterator`` is a distributed iterator (``iter(distribute(strategy, data))``) and each
    ``next`` gives one step's batches, whatever the sharding: a dataset function's per-replica
    batches, or a dataset's global batches, however ``experimental_distribute_dataset`` splits
    them among workers and replicas (auto-sharding by file rebatches each worker's own global
    batches, so that skipping on the dataset itself would skip the wrong ones). Every worker
    calls it alike, as it calls each training step.
    """
    for _ in range(steps):
        next(iterator)
    return iterator


def count_steps(
    data: DataLike, steps_per_epoch: int | None, on_parameter_servers: bool = False
) -> int:
    """Batches in one epoch: ``steps_per_epoch`` if given, else the dataset's finite length."""
    if steps_per_epoch is not None:
        if int(steps_per_epoch) != steps_per_epoch or steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch}")
        return int(steps_per_epoch)
    if on_parameter_servers:
        raise ValueError("parameter-server training needs steps_per_epoch (datasets repeat)")
    if not isinstance(data, tf.data.Dataset):
        raise ValueError("pass steps_per_epoch when data is a dataset function")
    cardinality = int(data.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError("the dataset repeats forever: pass steps_per_epoch")
    if cardinality < 0:
        raise ValueError(
            "the dataset's length is unknown (filter()? take() on a generator?): pass "
            "steps_per_epoch, or use repeat() with steps_per_epoch"
        )
    if cardinality == 0:
        raise ValueError("the dataset is empty")
    return cardinality
