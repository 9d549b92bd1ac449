"""Memory of a training step, counted from shapes: activations per example, weights, batch limits.

On a GPU TensorFlow reports its allocator's peak; on a CPU it reports nothing per step, and the
process's peak resident memory only grows. Counting from the layers' shapes is exact, works
everywhere, and is what decides whether a batch fits: the activations a backward pass keeps
grow with the batch, the weights, gradients and optimizer slots do not.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["activation_bytes_per_example", "limit_batch_size", "variable_bytes"]


def _dtype_bytes(dtype: Any) -> int:
    from course_utils.environment import import_tensorflow

    return import_tensorflow().as_dtype(dtype).size


def activation_bytes_per_example(model: Any) -> int:
    """Bytes of every layer's output for one example: what the backward pass keeps, per example.

    Input layers are left out (the batch itself is not an activation). A lower bound: some
    layers also keep intermediate values (e.g. a Dense layer's pre-activation).
    """
    total = 0
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        for output in outputs:
            total += math.prod(int(d) for d in output.shape[1:]) * _dtype_bytes(output.dtype)
    return total


def variable_bytes(model: Any) -> int:
    """Bytes of the model's weights (trainable and not)."""
    return sum(math.prod(int(d) for d in v.shape) * _dtype_bytes(v.dtype)
               for v in model.weights)


def _keras() -> Any:
    from course_utils.environment import import_tensorflow

    import_tensorflow()
    import keras

    return keras


_LIMIT_CLASS: list[type] = []


def _batch_size_limit_class() -> type:
    """The layer class (made on first use, so that importing this module stays cheap)."""
    if _LIMIT_CLASS:
        return _LIMIT_CLASS[0]
    keras = _keras()
    from course_utils.environment import import_tensorflow

    tf = import_tensorflow()

    class BatchSizeLimit(keras.layers.Layer):
        """Passes its input on, or fails like an out-of-memory error above ``max_batch_size``."""

        def __init__(self, max_batch_size: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_batch_size = int(max_batch_size)

        def call(self, inputs: Any) -> Any:
            check = tf.debugging.assert_less_equal(
                tf.shape(inputs)[0], self.max_batch_size,
                message=f"out of memory (simulated): a batch larger than {self.max_batch_size} "
                        "examples does not fit")
            with tf.control_dependencies([check]):
                return tf.identity(inputs)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "max_batch_size": self.max_batch_size}

    _LIMIT_CLASS.append(BatchSizeLimit)
    return BatchSizeLimit


def limit_batch_size(model: Any, max_batch_size: int) -> Any:
    """``model`` behind a layer that fails on batches over ``max_batch_size`` (shared weights)."""
    keras = _keras()
    inputs = keras.Input(shape=model.input_shape[1:], name="features")
    limited = _batch_size_limit_class()(max_batch_size, name="batch_size_limit")(inputs)
    return keras.Model(inputs, model(limited), name=f"{model.name}_limited")
