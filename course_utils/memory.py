"""Memory of a training step, counted from shapes: activations per example, weights, batch limits.

On a GPU TensorFlow reports its allocator's peak; on a CPU, by default, only where its oneDNN ops
are on (oneDNN's allocator keeps statistics, TensorFlow's default CPU allocator none; a BFC
allocator asked for with ``TF_CPU_ALLOCATOR_USE_BFC=true`` keeps them too), and a process's
peak resident memory holds whatever the process ran (Linux resets it only to the current size:
``peak_probe``). Counting from the layers' shapes works the same everywhere and is what the
course uses to judge whether a batch fits (an estimate of what is kept:
``activation_bytes_per_example``): the activations a backward pass keeps grow with the batch,
the weights, gradients and optimizer slots do not.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

from course_utils.peak_probe import gradient_step_peak_rises  # the measured side

__all__ = ["StepBudget", "activation_bytes_per_example", "count_on_tape",
           "gradient_step_peak_rises", "limit_batch_size", "smallest_accumulation", "step_budget",
           "trainable_bytes", "variable_bytes"]


def _dtype_bytes(dtype: Any) -> int:
    from course_utils.quiet import import_tensorflow

    # imported (and quieted) once: quieting again on every call clears every logger's cache,
    # thousands of calls per check under the grading guard's profiler (lesson 09, ex. 3)
    tf = sys.modules.get("tensorflow") or import_tensorflow()
    return tf.as_dtype(dtype).size


def _tensor_bytes(tensor: Any) -> int:
    return math.prod(int(d) for d in tensor.shape[1:]) * _dtype_bytes(tensor.dtype)


def _layer_output_bytes(model: Any) -> int:
    """Bytes of the outputs of ``model``'s layers, one example; nested models counted by their
    own layers (a nested model's output is its last layer's), input layers left out."""
    total = 0
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        if hasattr(layer, "layers") and hasattr(layer, "inputs"):  # a nested model
            total += _layer_output_bytes(layer)
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        total += sum(_tensor_bytes(output) for output in outputs)
    return total


def activation_bytes_per_example(model: Any, *, include_input: bool = True) -> int:
    """Bytes the backward pass keeps for one example: the input batch and every layer's output.

    A Dense layer's weight gradient needs its input (the previous layer's output, or for the
    first layer the input batch); TensorFlow's ReLU, tanh and sigmoid gradients use the layer's
    output (``_ReluGrad`` in ``tensorflow/python/ops/nn_grad.py``, ``_TanhGrad`` and
    ``_SigmoidGrad`` in ``math_grad.py`` read ``op.outputs[0]``), so for such a chain this count
    is what is kept. An under-count where a layer keeps more: swish, whose gradient needs its
    input, also keeps the pre-activation; TensorFlow's exact GELU keeps three tensors of that
    size (``0.5·x``, ``-x/√2`` and their ``erfc``); dropout keeps its mask. An over-count where
    a layer's output is read by no gradient: a Dense layer without activation followed by
    ``Activation("relu")``, or a ``BatchNormalization`` layer followed by a ReLU (BN's gradient
    reads its input, the ReLU's its output: BN's own output is not kept).
    ``include_input=False`` leaves the input out
    (a pipeline stage whose input is the previous stage's output, counted there).
    """
    total = _layer_output_bytes(model)
    if include_input:
        total += sum(_tensor_bytes(tensor) for tensor in model.inputs)
    return total


def trainable_bytes(model: Any) -> int:
    """Bytes of the trainable weights: the size of one gradient (or one optimizer slot)."""
    return sum(math.prod(int(d) for d in v.shape) * _dtype_bytes(v.dtype)
               for v in model.trainable_weights)


def variable_bytes(model: Any) -> int:
    """Bytes of the model's weights (trainable and not)."""
    return sum(math.prod(int(d) for d in v.shape) * _dtype_bytes(v.dtype)
               for v in model.weights)


def _keras() -> Any:
    from course_utils.quiet import import_tensorflow

    import_tensorflow()
    import keras

    return keras


_LIMIT_CLASSES: dict[str, type] = {}


_TWICE = ("out of memory (simulated): a forward pass was back-propagated twice (a "
                        "persistent tape asked for gradients again): its activations stay alive "
                        "on that tape until the tape is gone; one tape per micro-batch")


def count_on_tape(x: Any, counts: dict[str, Any], size: Any, max_examples: int, message: str,
                  also: Any = lambda alive: []) -> Any:
    """``x`` unchanged, its ``size`` examples counted as alive until a backward pass: added to
    ``counts["alive"]`` and ``counts["trained"]`` going forward (with or without a tape: no
    public API tells whether one records), taken from ``"alive"`` by the backward pass; more
    than ``max_examples`` alive fails with ``message`` (a simulated out-of-memory error).
    ``also(alive)`` gives more updates to run with the forward pass."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()

    @tf.custom_gradient
    def on_tape(inputs: Any) -> Any:
        alive = counts["alive"].assign_add(size)
        updates = [counts["trained"].assign_add(size), *also(alive)]
        check = tf.debugging.assert_less_equal(alive, tf.constant(max_examples, tf.int64),
                                               message=message)
        with tf.control_dependencies([check, *updates]):
            y = tf.identity(inputs)

        def backward(upstream: Any) -> Any:
            checks = []  # a forward's activations are freed once: a second backward of it
            if "freed" in counts:  # (a persistent tape asked twice) frees nothing
                checks.append(tf.debugging.assert_less_equal(
                    counts["freed"].assign_add(size), counts["trained"].read_value(),
                    message=_TWICE))
            with tf.control_dependencies(checks):
                freed = counts["alive"].assign(tf.maximum(counts["alive"] - size, 0))
            with tf.control_dependencies([freed]):
                return tf.identity(upstream)

        return y, backward

    return on_tape(x)


def _limit_classes() -> dict[str, type]:
    """The two layer classes (made on first use, so that importing this module stays cheap)."""
    if _LIMIT_CLASSES:
        return _LIMIT_CLASSES
    keras = _keras()
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()

    class BatchSizeLimit(keras.layers.Layer):
        """Passes its input on, or fails like an out-of-memory error above ``max_batch_size``."""

        def __init__(self, max_batch_size: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_batch_size = int(max_batch_size)
            self._seen = {"examples": tf.Variable(0, dtype=tf.int64, trainable=False)}

        @property
        def examples_seen(self) -> int:
            """Examples that went through the limit in any mode, in total."""
            return int(self._seen["examples"].numpy())

        def call(self, inputs: Any) -> Any:
            check = tf.debugging.assert_less_equal(
                tf.shape(inputs)[0], self.max_batch_size,
                message=f"out of memory (simulated): a batch larger than {self.max_batch_size} "
                        "examples does not fit")
            seen = self._seen["examples"].assign_add(tf.cast(tf.shape(inputs)[0], tf.int64))
            with tf.control_dependencies([check, seen]):
                return tf.identity(inputs)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "max_batch_size": self.max_batch_size}

    class ActivationsOnTape(keras.layers.Layer):
        """Counts the examples whose activations a backward pass would need: a forward pass
        in training mode adds its batch (with or without a tape: the count cannot tell), the
        backward pass through it takes the batch away; more than ``max_examples`` alive at
        once fails like an out-of-memory error."""

        def __init__(self, max_examples: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_examples = int(max_examples)
            self._counts = {name: tf.Variable(0, dtype=tf.int64, trainable=False)
                            for name in ("alive", "trained", "peak", "freed")}

        @property
        def examples_alive(self) -> int:
            """Examples whose forward pass (in training mode) has not been back-propagated."""
            return int(self._counts["alive"].numpy())

        @property
        def examples_trained(self) -> int:
            """Examples that went forward through the model in training mode, in total."""
            return int(self._counts["trained"].numpy())

        @property
        def peak_examples_alive(self) -> int:
            """The most examples alive at once, so far."""
            return int(self._counts["peak"].numpy())

        def call(self, inputs: Any, training: Any = None) -> Any:
            if not training:  # inference keeps no activations for a backward pass, so no
                return tf.stop_gradient(inputs)  # gradient flows back through it either
            counts, size = self._counts, tf.cast(tf.shape(inputs)[0], tf.int64)

            message = (f"out of memory (simulated): more than {self.max_examples} examples' "
                       "activations alive at once (each forward pass in training mode, with "
                       "or without a tape, keeps them until a tape.gradient back-propagates "
                       "through it)")
            return count_on_tape(inputs, counts, size, self.max_examples, message,
                                 also=lambda alive: [counts["peak"].assign(
                                     tf.maximum(counts["peak"], alive))])

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "max_examples": self.max_examples}

    _LIMIT_CLASSES.update(BatchSizeLimit=BatchSizeLimit, ActivationsOnTape=ActivationsOnTape)
    return _LIMIT_CLASSES


def limit_batch_size(model: Any, max_batch_size: int) -> Any:
    """``model`` behind a simulated memory of ``max_batch_size`` examples (shared weights).

    A layer before ``model`` (``batch_size_limit``) refuses a larger batch; a layer after it
    (``activations_on_tape``) refuses a forward pass in training mode while more than
    ``max_batch_size`` examples' activations are alive (one tape over several micro-batches
    keeps them all; a forward pass in training mode counts as alive, with or without a tape,
    until a backward pass through it), and counts the examples trained through it.
    """
    keras, classes = _keras(), _limit_classes()
    inputs = keras.Input(shape=model.input_shape[1:], name="features")
    limited = classes["BatchSizeLimit"](max_batch_size, name="batch_size_limit")(inputs)
    outputs = classes["ActivationsOnTape"](max_batch_size, name="activations_on_tape")(
        model(limited))
    return keras.Model(inputs, outputs, name=f"{model.name}_limited")

# --- one optimizer update's memory, per replica: the course's one budget ----------------------


@dataclass(frozen=True)
class StepBudget:
    """Bytes **per replica** for one optimizer update, term by term (see ``step_budget``)."""

    parameters: int
    gradients: int
    accumulation: int
    optimizer_slots: int
    activations: int

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.accumulation + self.optimizer_slots
                + self.activations)

    def rows(self) -> list[dict]:
        """``[{"term": ..., "bytes": ...}, ...]``, the five terms in order (for cu.show_table);
        ``total`` is their sum."""
        return [{"term": term, "bytes": getattr(self, term)}
                for term in ("parameters", "gradients", "accumulation", "optimizer_slots",
                             "activations")]


def step_budget(model: Any, *, global_batch: int, replicas: int = 1,
                accumulation_steps: int = 1, optimizer_slots: int = 2,
                zero_stage: int = 0) -> StepBudget:
    """The memory one replica needs for one optimizer update of ``model``, counted from shapes.

    - parameters: every weight (``variable_bytes``);
    - gradients: one gradient per trainable weight (``trainable_bytes``);
    - accumulation: with ``accumulation_steps`` > 1 a gradient-sized running sum, kept across
      the micro-batches (Keras's optimizers add one ``gradient_accumulator`` per weight:
      ``keras/src/optimizers/base_optimizer.py``); 0 without accumulation;
    - optimizer_slots: ``optimizer_slots`` gradient-sized slots (Adam 2, momentum 1, SGD 0);
    - activations: ``activation_bytes_per_example(model)`` x the micro-batch one replica
      runs at once, ``global_batch / replicas / accumulation_steps``.

    ``zero_stage`` 1, 2, 3 divide the slots, then also the gradients, then also the parameters
    by ``replicas`` (rounded up), as ZeRO partitions them. With ``accumulation_steps`` > 1 the
    gradients and the accumulation buffer stay whole under every stage, a choice: each replica
    sums its own micro-batches' whole gradients and reduces once per update, so nothing is
    sharded before the last micro-batch. (DeepSpeed's ZeRO-2/3 reduce-scatter after every
    micro-batch instead and keep a shard: ``deepspeed/runtime/engine.py``,
    ``allreduce_gradients``.)
    """
    for name, value in (("global_batch", global_batch), ("replicas", replicas),
                        ("accumulation_steps", accumulation_steps)):
        if int(value) < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if optimizer_slots < 0:
        raise ValueError(f"optimizer_slots must be at least 0, got {optimizer_slots}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if global_batch % replicas:
        raise ValueError(f"global_batch {global_batch} does not split over {replicas} replicas")
    per_replica = global_batch // replicas
    if per_replica % accumulation_steps:
        raise ValueError(f"the per-replica batch {per_replica} does not split into "
                         f"{accumulation_steps} equal micro-batches")
    micro = per_replica // accumulation_steps
    weights, gradient = variable_bytes(model), trainable_bytes(model)

    def share(size: int, from_stage: int) -> int:
        return -(-size // replicas) if zero_stage >= from_stage else size

    accumulating = accumulation_steps > 1  # one reduction per update: whole gradients
    return StepBudget(parameters=share(weights, 3),
                      gradients=gradient if accumulating else share(gradient, 2),
                      accumulation=gradient if accumulating else 0,
                      optimizer_slots=share(optimizer_slots * gradient, 1),
                      activations=activation_bytes_per_example(model) * micro)


def smallest_accumulation(model: Any, *, global_batch: int, budget_bytes: int,
                          replicas: int = 1, optimizer_slots: int = 2,
                          max_steps: int = 64) -> int | None:
    """The fewest micro-batches ``k`` (1 to ``max_steps``, dividing the per-replica batch) whose
    ``step_budget(...).total`` fits in ``budget_bytes``; None if none does.

    Going from k = 1 to k = 2 adds the accumulation buffer: where the fixed terms nearly fill
    the budget, splitting the batch may save less than the buffer costs, and no k fits.
    """
    if global_batch % replicas:
        raise ValueError(f"global_batch {global_batch} does not split over {replicas} replicas")
    per_replica = global_batch // replicas
    for steps in range(1, int(max_steps) + 1):
        if per_replica % steps:
            continue
        budget = step_budget(model, global_batch=global_batch, replicas=replicas,
                             accumulation_steps=steps, optimizer_slots=optimizer_slots)
        if budget.total <= budget_bytes:
            return steps
    return None

