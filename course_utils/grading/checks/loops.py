"""Training loops with a known mistake in their loss reduction, for lesson 02's diagnosis.

:func:`loop_with` builds ``make_train_step(model, optimizer)`` – a distributed training step of
the kind lesson 02 writes – whose replica loss or reported loss is wrong in one of the ways the
lesson measures (or right). The learner's ``diagnose_loop`` receives it as a black box and must
find out which it is by running it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DIAGNOSES", "loop_with"]

#: The answers ``diagnose_loop`` may give, one per reduction of lesson 02's section 5.
DIAGNOSES = (
    "right",
    "reduce_mean per replica",
    "global_batch_size passed positionally",
    "loss reported with ReduceOp.MEAN",
    "constant global_batch_size on a short batch",
    "Keras loss object on an uneven split",
)


def _replica_loss(kind: str, global_batch_size: int) -> Callable[[Any, Any], Any]:
    import keras

    tf = _tf()
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def counted(labels: Any, logits: Any) -> Any:
        examples = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
        return tf.nn.compute_average_loss(per_example(labels, logits), global_batch_size=examples)

    losses = {
        "right": counted,
        "loss reported with ReduceOp.MEAN": counted,
        "reduce_mean per replica": lambda labels, logits: tf.reduce_mean(
            per_example(labels, logits)),
        "global_batch_size passed positionally": lambda labels, logits: (
            tf.nn.compute_average_loss(per_example(labels, logits), global_batch_size)),
        "constant global_batch_size on a short batch": lambda labels, logits: (
            tf.nn.compute_average_loss(per_example(labels, logits),
                                       global_batch_size=global_batch_size)),
        "Keras loss object on an uneven split": keras.losses.SparseCategoricalCrossentropy(
            from_logits=True),
    }
    return losses[kind]


def loop_with(strategy: Any, kind: str, global_batch_size: int) -> Callable[[Any, Any], Any]:
    """``make_train_step(model, optimizer) -> train_step(distributed_batch) -> reported loss``,
    written for ``global_batch_size`` and wrong in the way ``kind`` (one of DIAGNOSES) names."""
    if kind not in DIAGNOSES:
        raise ValueError(f"kind must be one of {DIAGNOSES}, got {kind!r}")
    tf = _tf()
    replica_loss = _replica_loss(kind, global_batch_size)
    report = (tf.distribute.ReduceOp.MEAN if kind == "loss reported with ReduceOp.MEAN"
              else tf.distribute.ReduceOp.SUM)

    def make_train_step(model: Any, optimizer: Any) -> Callable[[Any], Any]:
        def replica_step(features: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = replica_loss(labels, model(features, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return tf.reduce_sum(loss)  # a scalar, also where a Keras loss object of an
            # empty replica gives shape [0]

        @tf.function
        def train_step(batch: Any) -> Any:
            return strategy.reduce(report, strategy.run(replica_step, args=batch), axis=None)

        return train_step

    return make_train_step
