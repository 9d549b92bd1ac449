"""Training loops with a known mistake in their loss reduction, for lesson 02's diagnosis.

:func:`loop_with` builds ``make_train_step(model, optimizer)`` – a distributed training step of
the kind lesson 02 writes – whose replica loss or reported loss is wrong in one of the ways the
lesson measures (or right). The learner's ``diagnose_loop`` receives it as a black box and must
find out which it is by running it: every kind runs the same code, with other numbers (scaled
by a random factor), so its closure names no mistake.
"""

from __future__ import annotations

import random
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


#: Every kind is one replica loss, sum(per-example losses) · a / (b · n + c · N + e) over the
#: replica's n examples (N: the step's), reported with strategy.reduce(SUM) · f:
#: a loop's closure holds numbers, never the name of its mistake. Per kind (G: the global
#: batch size written in the loop, R: replicas): (a, b, c, e, f).
def _reduction(kind: str, global_batch_size: int, replicas: int) -> tuple[float, ...]:
    g, r = float(global_batch_size), float(replicas)
    return {
        "right": (1.0, 0.0, 1.0, 0.0, 1.0),  # compute_average_loss over the counted batch
        "loss reported with ReduceOp.MEAN": (1.0, 0.0, 1.0, 0.0, 1.0 / r),
        "reduce_mean per replica": (1.0, 1.0, 0.0, 0.0, 1.0),  # tf.reduce_mean in a replica
        # compute_average_loss(losses, G): G taken as sample_weight, divided by n · R
        "global_batch_size passed positionally": (g, r, 0.0, 0.0, 1.0),
        "constant global_batch_size on a short batch": (1.0, 0.0, 0.0, g, 1.0),
        # a Keras loss object: the replica's mean, scaled by 1/R (scale_loss_for_distribution
        # in keras/src/losses/loss.py)
        "Keras loss object on an uneven split": (1.0, r, 0.0, 0.0, 1.0),
    }[kind]


def loop_with(strategy: Any, kind: str, global_batch_size: int) -> Callable[[Any, Any], Any]:
    """``make_train_step(model, optimizer) -> train_step(distributed_batch) -> reported loss``,
    written for ``global_batch_size`` and wrong in the way ``kind`` (one of DIAGNOSES) names."""
    if kind not in DIAGNOSES:
        raise ValueError(f"kind must be one of {DIAGNOSES}, got {kind!r}")
    import keras

    tf = _tf()
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    # one random factor through the fraction, another through the report: the same values,
    # but no constant in the closure is 1, R or a batch size
    scale, report_scale = (random.Random().uniform(0.5, 2.0) for _ in range(2))
    a, b, c, e, f = _reduction(kind, global_batch_size, strategy.num_replicas_in_sync)
    a, b, c, e = (tf.constant(scale * value) for value in (a, b, c, e))
    f_num, f_den = tf.constant(report_scale * f), tf.constant(report_scale)

    def make_train_step(model: Any, optimizer: Any) -> Callable[[Any], Any]:
        def replica_step(features: Any, labels: Any, total: Any) -> Any:
            n = tf.cast(tf.shape(labels)[0], tf.float32)
            with tf.GradientTape() as tape:
                losses = per_example(labels, model(features, training=True))
                loss = tf.math.divide_no_nan(tf.reduce_sum(losses) * a, b * n + c * total + e)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def train_step(batch: Any) -> Any:
            # the step's examples, counted from the replicas' shapes (no collective needed)
            total = tf.cast(tf.add_n([tf.shape(local)[0] for local in
                                      strategy.experimental_local_results(batch[1])]),
                            tf.float32)
            per_replica = strategy.run(replica_step, args=(*batch, total))
            reported = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            return reported * f_num / f_den

        return train_step

    return make_train_step
