"""What a loss reduction inside the replicas really computes, against one device.

Under a ``tf.distribute`` strategy each replica reduces the per-example losses of its own slice
of the global batch, and the optimizer **sums** the replicas' gradients. Whether that sum is the
gradient of the mean loss over the global batch depends on the reduction;
:func:`measure_reductions` runs several reductions on the same global batch, in one
``strategy.run``, and compares each with the one-device truth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["ReductionMeasurement", "measure_reductions"]

#: ``replica_loss(labels, logits) -> scalar``: a replica's loss on its slice of the batch
#: (``replica_loss(labels, logits, weights)`` when the batch carries per-example weights).
ReplicaLoss = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ReductionMeasurement:
    """One reduction on one global batch, measured against the mean loss on one device."""

    examples_per_replica: tuple[int, ...]
    loss_sum_ratio: float  # strategy.reduce(SUM) of the replicas' losses / the true mean loss
    loss_mean_ratio: float  # strategy.reduce(MEAN) of the replicas' losses / the true mean loss
    gradient_ratio: float  # norm of the summed gradient / norm of the true gradient
    gradient_error: float  # largest absolute difference from the true gradient

    @property
    def right(self) -> bool:
        """True when the summed gradient and the SUM-reduced loss are the one-device ones."""
        return (abs(self.gradient_ratio - 1) < 1e-4 and abs(self.loss_sum_ratio - 1) < 1e-4
                and self.gradient_error < 1e-5)


def measure_reductions(
    strategy: Any,
    model: Any,
    replica_losses: Mapping[str, ReplicaLoss],
    global_batch: tuple[Any, ...],
    per_example_loss: Callable[[Any, Any], Any],
) -> dict[str, ReductionMeasurement]:
    """Run each ``replica_loss`` in the replicas on ``global_batch`` and compare with one device.

    ``global_batch`` is ``(features, labels)``, split over the replicas as
    ``strategy.experimental_distribute_dataset`` splits a global batch (a short one too, so that
    some replicas get fewer examples, or none). The truth is the mean of
    ``per_example_loss(labels, logits)`` over the whole batch, and its gradient, computed by
    ``model`` outside the replicas. The model's weights are not changed. A batch of
    ``(features, labels, weights)`` is weighted: each replica loss is called with its slice of
    the weights too, and the truth is the weighted mean, ``sum(w * loss) / sum(w)``.
    """
    tf = _tf()
    features, labels, *weights = global_batch
    dataset = tf.data.Dataset.from_tensors(tuple(global_batch))
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    names = list(replica_losses)

    def replica_fn(features: Any, labels: Any, *weights: Any) -> Any:
        results = []
        for name in names:
            with tf.GradientTape() as tape:
                loss = replica_losses[name](labels, model(features, training=True), *weights)
            gradients = tape.gradient(loss, model.trainable_variables)
            results.append((loss, gradients, tf.shape(labels)[0]))
        return results

    @tf.function
    def run(iterator: Any) -> Any:
        # Inside the function, the slices have the dynamic shapes of a real training loop.
        per_replica = strategy.run(replica_fn, args=next(iterator))
        sum_, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
        return [(strategy.reduce(sum_, loss, axis=None), strategy.reduce(mean, loss, axis=None),
                 [strategy.reduce(sum_, g, axis=None) for g in gradients],
                 strategy.experimental_local_results(count))
                for loss, gradients, count in per_replica]

    with tf.GradientTape() as tape:
        losses = per_example_loss(labels, model(features, training=True))
        if weights:
            weight = tf.cast(weights[0], losses.dtype)
            true_loss = tf.reduce_sum(weight * losses) / tf.reduce_sum(weight)
        else:
            true_loss = tf.reduce_mean(losses)
    true_gradients = tape.gradient(true_loss, model.trainable_variables)
    true_norm = float(tf.linalg.global_norm(true_gradients))
    measured = {}
    for name, (sum_loss, mean_loss, gradients, counts) in zip(names, run(iterator),
                                                               strict=True):
        error = max(float(tf.reduce_max(tf.abs(g - t)))
                    for g, t in zip(gradients, true_gradients, strict=True))
        measured[name] = ReductionMeasurement(
            examples_per_replica=tuple(int(c) for c in counts),
            loss_sum_ratio=float(sum_loss) / float(true_loss),
            loss_mean_ratio=float(mean_loss) / float(true_loss),
            gradient_ratio=float(tf.linalg.global_norm(gradients)) / true_norm,
            gradient_error=error,
        )
    return measured
