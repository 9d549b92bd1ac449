"""Lessons 07, exercises 1 and 4: did every forward pass of the model go through its memory limit?

``counted_dense(units, ...)`` makes a ``keras.layers.Dense`` that counts the examples of every
call (any mode, eager or traced, on every replica of a strategy) in a variable kept outside the
layer (its weights stay the plain Dense's). It also notes a layer whose ``kernel`` is read
outside its own ``call`` (as by the parent's unbound ``keras.layers.Dense.call(layer, x)``,
which skips the count: ``Dense.call`` reads ``self.kernel``, ``keras/src/layers/core/dense.py``
line 222), and a layer called outside the replicas of a strategy (in its cross-replica
context). ``reached_around(model, limited)`` compares each counted layer of ``model`` with the
examples ``limited``'s ``batch_size_limit`` let through (or with ``through`` examples): a
forward pass that called ``model`` (or one of its layers) directly, around the limit, shows as
more examples inside. Still unseen: matrix products written by hand from the variables.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["counted_dense", "reached_around"]

_COUNTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_AROUND: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # layer: how
_INSIDE = threading.local()  # the counted layers whose call is running, in this thread
_CLASS: list[type] = []


def _counted_class() -> type:
    tf = _tf()
    import keras
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    class CountedDense(keras.layers.Dense):
        def call(self, inputs: Any) -> Any:
            inside = _INSIDE.__dict__.setdefault("layers", [])
            inside.append(self)
            try:
                counter = _COUNTS[self]  # distributed when made under a strategy's scope
                if isinstance(counter, tf.distribute.DistributedValues) and (
                        not tf.distribute.has_strategy()
                        or tf.distribute.in_cross_replica_context()):
                    if not in_symbolic_scope():  # not the functional model being built
                        _AROUND.setdefault(self, "was called outside the replicas")
                    return super().call(inputs)
                added = counter.assign_add(tf.cast(tf.shape(inputs)[0], tf.int64))
                with tf.control_dependencies([added]):
                    return super().call(tf.identity(inputs))
            finally:
                inside.pop()

        @property
        def kernel(self) -> Any:
            if self not in getattr(_INSIDE, "layers", []):
                _AROUND.setdefault(self, "had its kernel read outside its own call (as by "
                                   "keras.layers.Dense.call(layer, ...), which skips it)")
            return keras.layers.Dense.kernel.fget(self)

    return CountedDense


def counted_dense(units: int, **kwargs: Any) -> Any:
    """A Dense layer whose calls count their examples (read by :func:`reached_around`); its
    counter sums over the replicas when made under a strategy's scope."""
    tf = _tf()
    if not _CLASS:
        _CLASS.append(_counted_class())
    layer = _CLASS[0](units, **kwargs)
    _COUNTS[layer] = tf.Variable(0, dtype=tf.int64, trainable=False,
                                 synchronization=tf.VariableSynchronization.ON_READ,
                                 aggregation=tf.VariableAggregation.SUM)
    return layer


def reached_around(model: Any, limited: Any = None, *, through: int | None = None
                   ) -> str | None:
    """Why ``model``'s counted layers saw more examples than ``limited``'s limit let through
    (or than ``through``), or were reached around their count (None when neither)."""
    if through is None:
        through = limited.get_layer("batch_size_limit").examples_seen
    call_the_model = ("call the model you were given, not the model or the layers inside it")
    for layer in model.layers:
        if layer in _AROUND:
            return f"the layer {layer.name} inside the model {_AROUND[layer]}: {call_the_model}"
        if layer in _COUNTS and int(_COUNTS[layer].numpy()) != through:
            return (f"the layer {layer.name} inside the model ran on "
                    f"{int(_COUNTS[layer].numpy())} examples, but only {through} went through "
                    f"the memory limit of the model you were given: {call_the_model}")
    return None
