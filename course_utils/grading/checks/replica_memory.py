"""Lesson 07, exercise 4's memory limit per replica: a model behind a layer that, on each
replica of a ``tf.distribute`` strategy, refuses more than a micro-batch's share of examples'
activations alive until their backward pass (``lesson_07`` uses it)."""

from __future__ import annotations

from typing import Any

from course_utils.memory import count_on_tape
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["replica_limit"]


def replica_limit(model: Any, max_examples: int) -> tuple[Any, Any]:
    """``(limited, counts)``: ``model`` (shared weights) behind a layer that, on each replica,
    refuses a forward pass in training mode while more than ``max_examples`` examples'
    activations are alive (a batch larger than a micro-batch's share, or one tape over several
    micro-batches; a forward pass in training mode stays alive, with or without a tape, until
    a backward pass through it), and counts the examples trained. Build it under the
    strategy's scope: its counters are per replica (``ON_READ``), summed when read."""
    tf = _tf()
    import keras

    def counter() -> Any:
        return tf.Variable(0, dtype=tf.int64, trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)

    counts = {"alive": counter(), "trained": counter(), "freed": counter(), "seen": counter()}

    class ReplicaMemory(keras.layers.Layer):
        def call(self, inputs: Any, training: Any = None) -> Any:
            size = tf.cast(tf.shape(inputs)[0], tf.int64)
            if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
                with tf.control_dependencies([counts["seen"].assign_add(size)]):
                    inputs = tf.identity(inputs)  # every mode: the counted layers count all
            if not training:
                return inputs
            if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
                raise ValueError("the model was trained outside the replicas: no gradient "
                                 "crossed the replicas (lesson 07, section 5: where must "
                                 "each micro-batch run?)")

            return count_on_tape(
                inputs, counts, size, max_examples,
                f"out of memory (simulated): more than {max_examples} examples' "
                "activations alive on one replica at once (a replica holds one "
                "micro-batch's share; each forward pass in training mode, with or "
                "without a tape, stays alive until a tape.gradient back-propagates "
                "through it: how many of your micro-batches were alive at once?)")

    inputs = keras.Input(shape=model.input_shape[1:], name="features")
    outputs = ReplicaMemory(name="replica_memory")(model(inputs))
    return keras.Model(inputs, outputs, name=f"{model.name}_limited"), counts
