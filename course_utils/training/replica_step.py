"""The replica step: one optimizer update, run on every replica by ``strategy.run``.

Read this file next to lesson 02's hand-written loop (``notebooks/02_mirrored_strategy.ipynb``,
section 4, ``make_distributed_train_step``). It is the same loop, written once for the Trainer:

* the lesson's ``replica_step(features, labels)`` is ``replica_step(*micro_batches)`` here,
  made by :func:`make_replica_step`;
* its ``per_example_loss(labels, logits)`` (a Keras loss with ``reduction=None``) is
  :func:`per_example_loss`;
* its ``tf.nn.compute_average_loss(per_example_losses, global_batch_size=global_batch_size)``
  is the same call, with the global batch counted by :func:`count_examples`;
* its ``optimizer.apply_gradients(...)`` is ``optimizer.apply(gradients, variables)``;
* its ``distributed_train_step`` (``strategy.run``) is :func:`make_train_function`, which makes
  several updates per ``tf.function`` call;
* its ``strategy.reduce(SUM, per_replica_losses)`` is ``totals.add(...)``: the loss is summed
  on every replica and read once per epoch (``metrics.LossTotals``).

Where the two differ, a comment in the code says why. In short:

* **accumulation**: a step takes ``k`` micro-batches, adds up their gradients and applies them
  once (``accumulation.py``); the lesson's step takes one batch;
* **the global batch is counted**, not assumed: a short last batch, or a replica left empty by
  it, still gives the mean over the real examples;
* **loss scaling** (``mixed_float16``): the loss is scaled up before the gradients, and
  ``optimizer.apply`` scales them back down (``precision.py``);
* **non-finite steps are skipped on every replica** together, not only on the first;
* **regularization losses** (``model.losses``) are added, scaled by the number of replicas;
* under **parameter servers** each worker's step is its own global batch, and the step returns
  its loss, labels and predictions for the coordinator to count (``parameter_server.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_utils.quiet import import_tensorflow
from course_utils.training.accumulation import add_gradients
from course_utils.training.batches import (
    batch_size,
    concat_batches,
    static_batch_size,
    unpack_batch,
)
from course_utils.training.metrics import LossTotals
from course_utils.training.precision import (
    scale_loss,
    skip_everywhere_if_not_finite,
    to_float32,
    uses_loss_scaling,
)

tf = import_tensorflow()

__all__ = [
    "LossFn",
    "count_examples",
    "make_replica_step",
    "make_train_function",
    "per_example_loss",
    "regularization_loss",
]

#: ``loss_fn(labels, predictions) -> per-example losses`` (a Keras loss with reduction=None).
LossFn = Callable[[Any, Any], tf.Tensor]


def make_replica_step(
    model: Any,
    optimizer: Any,
    loss_fn: LossFn,
    metrics: Sequence[Any],
    totals: LossTotals | None,
    num_replicas: int,
    on_parameter_servers: bool = False,
) -> Callable[..., Any]:
    """Return ``replica_step(*micro_batches)``: one optimizer update, run by ``strategy.run``."""

    def replica_step(*micro_batches: Any) -> Any:
        """One update from ``micro_batches`` on this replica (the lesson's ``replica_step``)."""
        batches = [unpack_batch(batch) for batch in micro_batches]
        # The lesson divides by a fixed global_batch_size. Counting the examples instead keeps
        # the mean right on a short last batch, where some replicas get fewer (or none).
        examples_here, global_batch_size = count_examples(
            [labels for _, labels, _ in batches], num_replicas, on_parameter_servers
        )
        variables = model.trainable_variables
        gradients: list[Any] = [None] * len(variables)
        loss = tf.constant(0.0)
        previous_gradients: list[tf.Tensor] = []
        labels_seen, predictions_seen = [], []
        for features, labels, sample_weight in batches:
            # Accumulation (not in the lesson): the micro-batches run one after the other, so
            # only one of them holds its activations in memory at a time.
            with tf.control_dependencies(previous_gradients):
                with tf.GradientTape() as tape:
                    predictions = model(features, training=True)
                    per_example_losses = per_example_loss(
                        loss_fn, labels, predictions, sample_weight
                    )
                    micro_loss = tf.nn.compute_average_loss(
                        per_example_losses, global_batch_size=global_batch_size
                    )
                    if model.losses:
                        micro_loss += regularization_loss(model.losses, len(batches))
                    # Loss scaling (mixed_float16 only): small float16 gradients would round
                    # to zero, so the loss is scaled up here and optimizer.apply scales back.
                    scaled_loss = scale_loss(optimizer, micro_loss)
                micro_gradients = tape.gradient(scaled_loss, variables)
            gradients = add_gradients(gradients, micro_gradients)
            previous_gradients = [g for g in micro_gradients if g is not None]
            loss += micro_loss
            predictions = to_float32(predictions)
            if on_parameter_servers:
                # Metrics are counted on the coordinator (Keras 3's lose updates on workers).
                labels_seen.append(labels)
                predictions_seen.append(predictions)
            else:
                for metric in metrics:
                    metric.update_state(labels, predictions, sample_weight=sample_weight)
        if uses_loss_scaling(optimizer) and not on_parameter_servers and num_replicas > 1:
            # Keras checks finiteness on the first replica only: agree on all of them first.
            gradients = skip_everywhere_if_not_finite(
                tf.distribute.get_replica_context(), gradients
            )
        # As apply_gradients in the lesson: the gradients are summed over the replicas here.
        optimizer.apply(gradients, variables)
        count = tf.cast(global_batch_size, tf.float32)
        if on_parameter_servers:
            labels, predictions = concat_batches(labels_seen), concat_batches(predictions_seen)
            return loss * count, count, labels, predictions
        # Instead of returning the loss for strategy.reduce: summed where it was computed.
        totals.add(loss * count, tf.cast(examples_here, tf.float32))
        return None

    return replica_step


def make_train_function(
    strategy: tf.distribute.Strategy, replica_step: Callable[..., Any], num_micro_batches: int
) -> Callable[[Any, tf.Tensor], None]:
    """A ``tf.function(iterator, num_updates)`` making ``num_updates`` replica steps."""

    @tf.function
    def train_function(iterator: Any, num_updates: tf.Tensor) -> None:
        """Make ``num_updates`` updates on every replica (the lesson's train step)."""
        # The lesson calls its step once per batch from Python; looping inside the tf.function
        # makes several updates per call (steps_per_execution) with less Python overhead.
        for _ in tf.range(num_updates):
            micro_batches = tuple(next(iterator) for _ in range(num_micro_batches))
            strategy.run(replica_step, args=micro_batches)

    return train_function


def per_example_loss(
    loss_fn: LossFn, labels: Any, predictions: Any, sample_weight: Any
) -> tf.Tensor:
    """The float32 loss of each example, shape ``[batch]`` (extra axes averaged, weighted)."""
    per_example = tf.cast(loss_fn(labels, to_float32(predictions)), tf.float32)
    if per_example.shape.rank == 0:
        raise ValueError(
            "loss_fn returned a scalar; it must return per-example losses of shape [batch] "
            "(for a Keras loss use reduction=None)"
        )
    if per_example.shape.rank is not None and per_example.shape.rank > 1:
        per_example = tf.reduce_mean(per_example, axis=list(range(1, per_example.shape.rank)))
    if sample_weight is not None:
        per_example = per_example * tf.cast(tf.reshape(sample_weight, [-1]), tf.float32)
    return per_example


def count_examples(
    labels_per_micro_batch: Sequence[Any], num_replicas: int, on_parameter_servers: bool = False
) -> tuple[tf.Tensor, tf.Tensor]:
    """Examples on this replica and in the global batch (int64), in replica context."""
    examples_here = tf.add_n(
        [tf.cast(batch_size(labels), tf.int64) for labels in labels_per_micro_batch]
    )
    if on_parameter_servers:
        return examples_here, examples_here  # each worker's step is its own global batch
    static_sizes = [static_batch_size(labels) for labels in labels_per_micro_batch]
    if all(size is not None for size in static_sizes):
        return examples_here, tf.constant(sum(static_sizes) * num_replicas, tf.int64)
    # float32 all-reduce: TPUs have no int64 collectives (exact up to 2**24 examples).
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(examples_here, tf.float32)
    )
    return examples_here, tf.cast(summed, tf.int64)


def regularization_loss(losses: Sequence[tf.Tensor], num_micro_batches: int) -> tf.Tensor:
    """This micro-batch's share of the model's regularization losses on this replica."""
    total = tf.add_n([tf.cast(t, tf.float32) for t in losses])
    return tf.nn.scale_regularization_loss(total) / num_micro_batches
