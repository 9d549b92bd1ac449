"""Lesson 07, exercise 1: did every forward pass of the model go through its memory limit?

``counted_dense(units, ...)`` makes a ``keras.layers.Dense`` that counts the examples of every
call (any mode, eager or traced) in a variable kept outside the layer (its weights stay the
plain Dense's). ``reached_around(model, limited)`` compares each counted layer of ``model``
with the examples ``limited``'s ``batch_size_limit`` let through: a forward pass that called
``model`` (or one of its layers) directly, around the limit, shows as more examples inside.
"""

from __future__ import annotations

import weakref
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["counted_dense", "reached_around"]

_COUNTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_CLASS: list[type] = []


def counted_dense(units: int, **kwargs: Any) -> Any:
    """A Dense layer whose calls count their examples (read by :func:`reached_around`)."""
    tf = _tf()
    if not _CLASS:
        import keras

        class CountedDense(keras.layers.Dense):
            def call(self, inputs: Any) -> Any:
                added = _COUNTS[self].assign_add(tf.cast(tf.shape(inputs)[0], tf.int64))
                with tf.control_dependencies([added]):
                    return super().call(tf.identity(inputs))

        _CLASS.append(CountedDense)
    layer = _CLASS[0](units, **kwargs)
    _COUNTS[layer] = tf.Variable(0, dtype=tf.int64, trainable=False)
    return layer


def reached_around(model: Any, limited: Any) -> str | None:
    """Why ``model``'s counted layers saw more examples than ``limited``'s limit let through
    (None when they saw the same)."""
    through = limited.get_layer("batch_size_limit").examples_seen
    for layer in model.layers:
        if layer in _COUNTS and int(_COUNTS[layer].numpy()) != through:
            return (f"the layer {layer.name} inside the model ran on "
                    f"{int(_COUNTS[layer].numpy())} examples, but only {through} went through "
                    "the memory limit of the model you were given: call that model, not the "
                    "model or the layers inside it")
    return None
