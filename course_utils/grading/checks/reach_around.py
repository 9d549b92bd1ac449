"""Lessons 07, exercises 1 and 4: did every forward pass of the model go through its memory limit?

``counted_dense(units, ...)`` makes a ``keras.layers.Dense`` that counts the examples of every
call (any mode, eager or traced, on every replica of a strategy) in a variable kept outside the
layer (its weights stay the plain Dense's). It also notes a layer whose ``kernel`` is read
outside its own ``call`` (as by the parent's unbound ``keras.layers.Dense.call(layer, x)``,
which skips the count: ``Dense.call`` reads ``self.kernel``, ``keras/src/layers/core/dense.py``
line 222), and a layer called outside the replicas of a strategy (in its cross-replica
context). ``reached_around(model, limited)`` compares each counted layer of ``model`` with the
examples ``limited``'s limit (``batch_size_limit``; exercise 4's ``replica_memory``) let
through (or with ``through`` examples): a
forward pass that called ``model`` (or one of its layers) directly, around the limit, shows as
more examples inside. With ``most``, it also compares the limit and each limiting layer's recorded
peak of examples alive at once (exercise 1's ``activations_on_tape``; exercise 4's
``replica_memory``, the largest over the replicas) with ``most``, the problem's micro-batch
(share): a limit the answer raised, then set back, cannot hide a whole group alive at once.
The peaks are variables: an answer that reaches them (exercise 1's through the layer's private
``_counts``, exercise 4's through ``replica_memory``'s table) and assigns them back is unseen.
``counted_dense(..., flows=True)`` (exercise 1) also adds, in
variables kept outside the layer, the gradients that flow back to its kernel and bias through
its calls; ``applied_from_calls(optimizer, model)`` makes the optimizer compare, at every
update, the gradients it applies with those sums (one factor allowed: a sum divided after
the micro-batches) and empty them: a forward written by hand from the variables, its
gradients applied while the counted calls' went elsewhere, differs. Still unseen: a hand
forward whose gradients are applied only after the counted calls computed the same ones.
A ``flows`` layer also counts its calls in training mode and sums their input rows
(``fed_in_training``): which examples went forward, not only how many.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["UpdatesWatched", "WRITTEN_OUTSIDE", "applied_from_calls", "counted_dense",
           "fed_in_training", "reached_around", "sgd_steps_off"]

_COUNTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_AROUND: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # layer: how
_INSIDE = threading.local()  # the counted layers whose call is running, in this thread
_CLASS: list[type] = []
_FLOWS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # layer: its sums
_FED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # layer: (calls, sum)


def _noted(value: Any, total: Any) -> Any:
    """``value`` (a weight), its gradient added to ``total`` on its way back."""
    tf = _tf()

    @tf.custom_gradient
    def identity(tensor: Any) -> Any:
        def backward(upstream: Any) -> Any:
            with tf.control_dependencies([total.assign_add(tf.convert_to_tensor(upstream))]):
                return tf.identity(upstream)

        return tf.identity(tensor), backward

    return identity(tf.convert_to_tensor(value))


def _local(value: Any) -> Any:
    """A counter of ``value``'s shape: kept per replica (``ON_READ``, summed when read) under
    a strategy's scope, so that each replica adds to its own; a plain variable elsewhere."""
    tf = _tf()
    if not tf.distribute.has_strategy():
        return tf.Variable(value, trainable=False)
    return tf.Variable(value, trainable=False,
                       synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM)


def _counted_class() -> type:
    tf = _tf()
    import keras
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    class CountedDense(keras.layers.Dense):
        def call(self, inputs: Any, training: Any = None) -> Any:
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
                    if self not in _FLOWS:
                        return super().call(tf.identity(inputs))
                    if not _FLOWS[self]:  # (weight, the sum of its gradients here)
                        with tf.init_scope():  # per replica under a strategy (exercise 4)
                            _FLOWS[self] = [(w, _local(tf.zeros(w.shape, w.dtype)))
                                            for w in (self.kernel, self.bias)]
                            _FED[self] = (_local(tf.constant(0, tf.int64)),
                                          _local(tf.zeros([inputs.shape[-1]], tf.float64)))
                    fed = []
                    if training:  # which examples went forward in training mode, per call
                        calls, total = _FED[self]
                        fed = [calls.assign_add(1), total.assign_add(tf.reduce_sum(
                            tf.cast(inputs, tf.float64), axis=0))]
                    kernel, bias = (_noted(w, total) for w, total in _FLOWS[self])
                    with tf.control_dependencies(fed):
                        return self.activation(tf.matmul(tf.identity(inputs), kernel) + bias)
            finally:
                inside.pop()

        @property
        def kernel(self) -> Any:
            if self not in getattr(_INSIDE, "layers", []):
                _AROUND.setdefault(self, "had its kernel read outside its own call (as by "
                                   "keras.layers.Dense.call(layer, ...), which skips it)")
            return keras.layers.Dense.kernel.fget(self)

    return CountedDense


def counted_dense(units: int, *, flows: bool = False, **kwargs: Any) -> Any:
    """A Dense layer whose calls count their examples (read by :func:`reached_around`); its
    counter sums over the replicas when made under a strategy's scope. ``flows`` (not under
    a strategy): its calls also sum the gradients flowing back to its weights."""
    tf = _tf()
    if not _CLASS:
        _CLASS.append(_counted_class())
    layer = _CLASS[0](units, **kwargs)
    if flows:
        _FLOWS[layer] = []  # made at its first call
    _COUNTS[layer] = tf.Variable(0, dtype=tf.int64, trainable=False,
                                 synchronization=tf.VariableSynchronization.ON_READ,
                                 aggregation=tf.VariableAggregation.SUM)
    return layer


def fed_in_training(model: Any) -> tuple[int, Any] | None:
    """``(calls, the sum of their input rows)``: what went forward in training mode through
    the first ``flows`` layer of ``model`` (None before its first call): the micro-batches
    that ran, each once, and no others (a skipped one padded by a dummy forward differs)."""
    layer = next((layer for layer in model.layers if layer in _FED), None)
    if layer is None:
        return None
    calls, total = _FED[layer]
    return int(calls.numpy()), total.numpy()


def reached_around(model: Any, limited: Any = None, *, through: int | None = None,
                   most: int | None = None) -> str | None:
    """Why ``model``'s counted layers saw more examples than ``limited``'s limit let through
    (or than ``through``), or were reached around their count (None when neither); with
    ``most``, also why ``limited``'s limit (``most`` examples, per replica for exercise 4's
    ``replica_memory``) did not hold: changed, or more examples' activations alive at once
    than it allows (each limiting layer's recorded ``peak_examples_alive``)."""
    if most is not None:
        sizes = tuple(getattr(layer, name) for layer in limited.layers
                      for name in ("max_batch_size", "max_examples") if hasattr(layer, name))
        peak = max((layer.peak_examples_alive for layer in limited.layers
                    if hasattr(layer, "peak_examples_alive")), default=None)
        if peak is None or not sizes or set(sizes) != {most} or peak > most:
            where = " on one replica" if "replica_memory" in (
                layer.name for layer in limited.layers) else ""
            return (f"the memory limit of the model you were given holds {most} examples"
                    f"{where}, but {peak} examples' activations were alive at once (the limit "
                    f"read {sizes}): keep one micro-batch alive at a time, and leave the limit "
                    "alone")
    if through is None:
        through = next(layer.examples_seen for layer in limited.layers
                       if hasattr(layer, "examples_seen"))  # in any mode
    call_the_model = ("call the model you were given, not the model or the layers inside it")
    for layer in model.layers:
        if layer in _AROUND:
            return f"the layer {layer.name} inside the model {_AROUND[layer]}: {call_the_model}"
        if layer in _COUNTS and int(_COUNTS[layer].numpy()) != through:
            return (f"the layer {layer.name} inside the model ran on "
                    f"{int(_COUNTS[layer].numpy())} examples, but only {through} went through "
                    f"the memory limit of the model you were given: {call_the_model}")
    return None


def applied_from_calls(optimizer: Any, model: Any) -> Any:
    """``worst``, a variable: ``optimizer`` (a Keras optimizer, changed in place) compares, at
    every update, the gradients it applies with ``a·`` the sums that flowed back through
    ``model``'s ``flows`` layers since the last update (``a`` fitted; what is left, relative
    to the applied gradients' size, raises ``worst``), then empties those sums. Where a
    kernel has a regularizer (exercise 4's L2 penalty, whose gradient ``∝`` the kernel flows
    through no call), ``b·`` the kernels is fitted too. Under a strategy's scope, each replica
    compares its own gradients with its own sums (``worst`` per replica: take the largest)."""
    tf = _tf()
    worst = _local(tf.constant(0.0))
    layers = [layer for layer in model.layers if layer in _FLOWS]
    apply = optimizer.apply

    def compared(grads: Any, trainable_variables: Any = None) -> Any:
        variables = list(trainable_variables if trainable_variables is not None else
                         optimizer._trainable_variables)
        flowed = {id(w): total for layer in layers for w, total in _FLOWS[layer]}
        pairs = [(tf.reshape(tf.convert_to_tensor(g), [-1]), tf.reshape(flowed[id(v)], [-1]))
                 for g, v in zip(grads, variables, strict=True) if id(v) in flowed]
        if not pairs:
            return apply(grads, trainable_variables)  # not the model's weights: unchecked
        named = [id(v) for v in variables if id(v) in flowed]
        if len(named) != len(set(named)) or set(named) != set(flowed):
            with tf.control_dependencies([worst.assign(1.0)]):  # a weight twice, or left out
                return apply(grads, trainable_variables)
        regularized = {id(w) for layer in layers for w, _ in _FLOWS[layer][:1]
                       if getattr(layer, "kernel_regularizer", None) is not None}
        penalty = [tf.reshape(tf.convert_to_tensor(v), [-1]) * float(id(v) in regularized)
                   for v in variables if id(v) in flowed]
        left = _left_after_fit(*(tf.cast(tf.concat(list(side), 0), tf.float64) for side in
                                 zip(*pairs, strict=True)), tf.cast(tf.concat(
                                     penalty, 0), tf.float64) if regularized else None)
        left = tf.cast(left, tf.float32)
        with tf.control_dependencies([worst.assign(tf.maximum(worst, left))]):
            emptied = [total.assign(tf.zeros_like(total)) for total in flowed.values()]
        with tf.control_dependencies(emptied):
            return apply(grads, trainable_variables)

    optimizer.apply = compared
    return worst


def _left_after_fit(a: Any, f: Any, w: Any = None) -> Any:
    """What of ``a`` is left, relative to its size, after the best ``s·f`` (and ``t·w``)."""
    tf = _tf()
    if w is None:
        scale = tf.math.divide_no_nan(tf.reduce_sum(a * f), tf.reduce_sum(f * f))
        return tf.math.divide_no_nan(tf.norm(a - scale * f), tf.norm(a))
    ff, fw, ww = tf.reduce_sum(f * f), tf.reduce_sum(f * w), tf.reduce_sum(w * w)
    af, aw = tf.reduce_sum(a * f), tf.reduce_sum(a * w)
    det = ff * ww - fw * fw  # the normal equations of two coefficients, by Cramer's rule
    s = tf.math.divide_no_nan(af * ww - aw * fw, det)
    t = tf.math.divide_no_nan(aw * ff - af * fw, det)
    return tf.math.divide_no_nan(tf.norm(a - s * f - t * w), tf.norm(a))


def sgd_steps_off(optimizer: Any) -> Any:
    """``off``, a variable: how far, at any update, a weight moved from ``before - rate ·
    gradient`` (plain SGD, the checks' optimizer; relative to the step, float32 rounding
    allowed), ``optimizer.apply`` wrapped in place: an update replaced inside ``apply`` (the
    instance's ``_backend_update_step``, say) that writes weights trained elsewhere."""
    tf = _tf()
    off = tf.Variable(0.0, trainable=False)
    apply = optimizer.apply

    def checked(grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        variables = list(trainable_variables if trainable_variables is not None else
                         optimizer._trainable_variables)
        pairs = [(tf.convert_to_tensor(g), v) for g, v in zip(grads, variables, strict=True)
                 if g is not None]
        before = [tf.identity(tf.convert_to_tensor(v)) for _, v in pairs]
        result = apply(grads, trainable_variables)
        rate = tf.cast(optimizer.learning_rate, tf.float32)
        for (g, v), b in zip(pairs, before, strict=True):
            left = tf.reduce_max(tf.abs(tf.convert_to_tensor(v) - (b - rate * g)))
            left -= 1e-6 * tf.reduce_max(tf.abs(b))  # float32 rounding of the weight
            off.assign(tf.maximum(off, left / (rate * tf.reduce_max(tf.abs(g)) + 1e-12)))
        return result

    optimizer.apply = checked
    return off


def rate_moves(optimizer: Any) -> Any:
    """``moved``, a variable: how far ``optimizer``'s learning rate stood, at any update, from
    the rate it has now (``optimizer.apply`` wrapped in place). Dividing the rate instead of
    the gradients gives the same weights under plain SGD only."""
    tf = _tf()
    given = float(optimizer.learning_rate)
    moved = tf.Variable(0.0, trainable=False)
    apply = optimizer.apply

    def watched(grads: Any, trainable_variables: Any = None) -> Any:
        rate = tf.cast(optimizer.learning_rate, tf.float32)
        with tf.control_dependencies([moved.assign(tf.maximum(moved, tf.abs(rate - given)))]):
            return apply(grads, trainable_variables)

    optimizer.apply = watched
    return moved


class UpdatesWatched:
    """``optimizer.apply`` (``apply_gradients`` calls it) wrapped in place for exercises 1 and
    4: it counts its calls (``calls``: ``optimizer.iterations`` is floor-divided by Keras's
    ``gradient_accumulation_steps``, ``keras/src/optimizers/base_optimizer.py`` lines 196-202,
    so k applies per group under that option counted one) and keeps a copy of ``model``'s
    trainable weights as each update left them; a weight that differs from that copy before the
    next update, or at the end (:meth:`written_outside`), was written outside the optimizer (a
    ``set_weights`` or an ``assign``: weights trained elsewhere, written in). Made under a
    strategy's scope, each replica keeps its own copy and count (``ON_READ``)."""

    def __init__(self, optimizer: Any, model: Any) -> None:
        tf = _tf()
        self.variables = list(model.trainable_variables)

        def local(value: Any, dtype: Any = None) -> Any:
            return tf.Variable(value, dtype=dtype, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        self.copies = [local(tf.convert_to_tensor(v)) for v in self.variables]
        self.moved, self.counted = local(0, tf.int64), local(0, tf.int64)
        apply = optimizer.apply

        def watched(grads: Any, trainable_variables: Any = None) -> Any:
            moved = self.moved.assign(tf.maximum(self.moved, tf.cast(self._differs(), tf.int64)))
            with tf.control_dependencies([moved, self.counted.assign_add(1)]):
                result = apply(grads, trainable_variables)
            for variable, copy in zip(self.variables, self.copies, strict=True):
                copy.assign(tf.convert_to_tensor(variable))  # after the update: program order
            return result

        optimizer.apply = watched

    def _differs(self) -> Any:
        tf = _tf()
        return tf.reduce_any([tf.reduce_any(tf.abs(tf.convert_to_tensor(v) - c) > 0)
                              for v, c in zip(self.variables, self.copies, strict=True)])

    @property
    def calls(self) -> int:
        """How many times ``optimizer.apply`` ran (on the first replica)."""
        return int(self.counted.numpy())

    def written_outside(self) -> bool:
        """Whether a weight changed outside ``optimizer.apply``, between updates or after the
        last (on any replica)."""
        tf = _tf()
        strategy = tf.distribute.get_strategy()
        copies = [strategy.experimental_local_results(c) for c in self.copies]
        weights = [strategy.experimental_local_results(getattr(v, "value", v))
                   for v in self.variables]
        return any(int(m.numpy()) for m in strategy.experimental_local_results(self.moved)) or any(
            bool(tf.reduce_any(tf.abs(tf.convert_to_tensor(w) - c) > 0))
            for ws, cs in zip(weights, copies, strict=True) for w, c in zip(ws, cs, strict=True))


#: What :meth:`UpdatesWatched.written_outside` tells the learner.
WRITTEN_OUTSIDE = ("the model's weights changed outside optimizer.apply_gradients (between two "
                   "updates, or after the last: a set_weights or an assign?): every change of "
                   "the weights must be an update the optimizer you were given applies, of "
                   "the micro-batches' gradients")
