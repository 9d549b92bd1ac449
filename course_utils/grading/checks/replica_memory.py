"""Lesson 07, exercise 4's memory limit per replica: a model behind a layer that, on each
replica of a ``tf.distribute`` strategy, refuses more than a micro-batch's share of examples'
activations alive until their backward pass (``lesson_07`` uses it).

The layer keeps its limit as ``max_examples`` (read when its call is traced) and records, on
each replica, the most examples alive at once: ``peak_examples_alive`` is the largest over the
replicas, which ``reach_around.reached_around(..., most=)`` compares with the problem's
micro-batch share, so that a limit raised by the answer (the attribute, or anything the call
reads) cannot hide a whole group alive at once. The counters live in this module's table, keyed
by the layer, not in the layer nor in its call's closure: an answer that imports this module
and assigns the recorded peak back is still not seen (nothing in one process is out of reach).

``counting_mirrored_strategy`` makes the exercise's strategy, whose cross-device ops count the
tensors they all-reduce (one all-reduce of the gradients per update is the exercise's rule).
"""

from __future__ import annotations

import weakref
from typing import Any

from course_utils.memory import count_on_tape
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["counting_mirrored_strategy", "replica_limit"]

_COUNTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_CLASS: list[type] = []


def _replica_memory_class() -> type:
    if _CLASS:
        return _CLASS[0]
    tf = _tf()
    import keras

    class ReplicaMemory(keras.layers.Layer):
        def __init__(self, max_examples: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_examples = int(max_examples)
            self._strategy = tf.distribute.get_strategy()

        @property
        def examples_seen(self) -> int:
            """Examples that went through the layer in any mode, on all replicas together."""
            return int(_COUNTS[self]["seen"].numpy())

        @property
        def peak_examples_alive(self) -> int:
            """The most examples alive at once on one replica, so far."""
            peaks = self._strategy.experimental_local_results(_COUNTS[self]["peak"])
            return max(int(peak.numpy()) for peak in peaks)

        def call(self, inputs: Any, training: Any = None) -> Any:
            counts, size = _COUNTS[self], tf.cast(tf.shape(inputs)[0], tf.int64)
            if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
                with tf.control_dependencies([counts["seen"].assign_add(size)]):
                    inputs = tf.identity(inputs)  # every mode: the counted layers count all
            if not training:  # no activations kept, so no gradient back through it
                return tf.stop_gradient(inputs)
            if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
                raise ValueError("the model was trained outside the replicas: no gradient "
                                 "crossed the replicas (lesson 07, section 5: where must "
                                 "each micro-batch run?)")
            most = self.max_examples
            return count_on_tape(
                inputs, counts, size, most,
                f"out of memory (simulated): more than {most} examples' "
                "activations alive on one replica at once (a replica holds one "
                "micro-batch's share; each forward pass in training mode, with or "
                "without a tape, stays alive until a tape.gradient back-propagates "
                "through it: how many of your micro-batches were alive at once?)",
                also=lambda alive: [counts["peak"].assign(tf.maximum(counts["peak"], alive))])

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "max_examples": self.max_examples}

    _CLASS.append(ReplicaMemory)
    return ReplicaMemory


def replica_limit(model: Any, max_examples: int) -> tuple[Any, Any]:
    """``(limited, counts)``: ``model`` (shared weights) behind a layer (``replica_memory``)
    that, on each replica, refuses a forward pass in training mode while more than
    ``max_examples`` examples' activations are alive (a batch larger than a micro-batch's
    share, or one tape over several micro-batches; a forward pass in training mode stays
    alive, with or without a tape, until a backward pass through it), counts the examples
    trained and records each replica's peak alive (its ``peak_examples_alive``). Build it
    under the strategy's scope: its counters are per replica (``ON_READ``), summed when read."""
    tf = _tf()
    import keras

    def counter() -> Any:
        return tf.Variable(0, dtype=tf.int64, trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)

    counts = {name: counter() for name in ("alive", "trained", "freed", "seen", "peak")}
    memory = _replica_memory_class()(max_examples, name="replica_memory")
    _COUNTS[memory] = counts
    inputs = keras.Input(shape=model.input_shape[1:], name="features")
    outputs = memory(model(inputs))
    return keras.Model(inputs, outputs, name=f"{model.name}_limited"), counts


def counting_mirrored_strategy(num_replicas: int = 2) -> tuple[Any, Any]:
    """``(strategy, counter)``: a MirroredStrategy over the first ``num_replicas`` replica
    devices whose cross-device ops add to ``counter`` (a ``tf.Variable``) the number of tensors
    each all-reduce carries, when it runs (in a ``tf.function`` too)."""
    from course_utils.strategies import replica_devices

    tf = _tf()
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)

    class CountingAllReduce(tf.distribute.ReductionToOneDevice):
        """Reduce to one device and broadcast back, counting the tensors of each call."""

        nested = False

        def batch_reduce_implementation(self, reduce_op: Any, pairs: Any, options: Any) -> Any:
            counter.assign_add(len(pairs))
            self.nested = True  # the parent reduces the batch one tensor at a time
            try:
                return super().batch_reduce_implementation(reduce_op, pairs, options)
            finally:
                self.nested = False

        def reduce_implementation(self, reduce_op: Any, value: Any, destinations: Any,
                                  options: Any) -> Any:
            if not self.nested:
                counter.assign_add(1)
            return super().reduce_implementation(reduce_op, value, destinations, options)

    devices = replica_devices(num_replicas)
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=CountingAllReduce()), counter
