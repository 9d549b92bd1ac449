"""Evaluation: the replica step's forward pass and loss, without gradients or updates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.quiet import import_tensorflow
from course_utils.training.batches import batch_size, unpack_batch
from course_utils.training.metrics import LossTotals
from course_utils.training.precision import to_float32
from course_utils.training.replica_step import LossFn, per_example_loss

tf = import_tensorflow()

__all__ = ["make_eval_function"]


def make_eval_function(
    strategy: tf.distribute.Strategy,
    model: Any,
    loss_fn: LossFn,
    metrics: Sequence[Any],
    totals: LossTotals,
) -> Any:
    """A ``tf.function(iterator, num_steps)`` adding ``num_steps`` batches to totals and metrics."""

    def replica_eval(batch: Any) -> None:
        features, labels, sample_weight = unpack_batch(batch)
        predictions = model(features, training=False)
        per_example = per_example_loss(loss_fn, labels, predictions, sample_weight)
        totals.add(tf.reduce_sum(per_example), tf.cast(batch_size(labels), tf.float32))
        predictions = to_float32(predictions)
        for metric in metrics:
            metric.update_state(labels, predictions, sample_weight=sample_weight)

    @tf.function
    def eval_function(iterator: Any, num_steps: tf.Tensor) -> None:
        for _ in tf.range(num_steps):
            strategy.run(replica_eval, args=(next(iterator),))

    return eval_function
