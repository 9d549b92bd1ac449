"""Lesson 02's distributed step that clips by the global norm: the check's run and reference.

The step's update must be the gradient of the global batch's in-batch softmax loss (each query
scored against every key of the batch: ``batch_negatives``) clipped to a global norm, as
``tf.clip_by_global_norm`` clips it on one device. Under a strategy each replica holds a part of
that gradient until the optimizer sums the parts, so a clip inside the replica (or Keras's
``global_clipnorm``, which clips before its all-reduce: ``_backend_apply_gradients`` in
keras/src/optimizers/base_optimizer.py, then ``_all_reduce_sum_gradients`` in
keras/src/backend/tensorflow/optimizer.py) clips the part, not the gradient. What each replica
trained on is seen twice: the examples its first layer ran on (counted: each pair's query and
key once) and the gradients that flowed back through its Dense calls, which must explain what
the optimizer is handed (:class:`Flows`). The one-device reference is computed only after the
learner's step has run: while it runs, nothing in the process holds the expected weights or
losses.
"""

from __future__ import annotations

from typing import Any

from course_utils.equality import largest_difference
from course_utils.grading.checks.batch_negatives import pair_loss
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["Flows", "clip_norm_for", "learner_run", "reference_run", "verifier"]

LEARNING_RATE = 0.5
#: The check's optimizer and the reference's: SGD with momentum, whose update from step 2 on
#: no plain SGD rule typed by hand (``v.assign_sub(lr * g)``, the optimizer unused) matches.
MOMENTUM = 0.9


def clip_norm_for(dataset: Any, model: Any) -> float:
    """Half the global norm of the first batch's one-device gradient: the clip binds."""
    tf = _tf()
    with tf.GradientTape() as tape:
        loss = pair_loss(tf, model, next(iter(dataset)))
    norm = float(tf.linalg.global_norm(tape.gradient(loss, model.trainable_variables)))
    return float(f"{norm / 2:.3g}")


def reference_run(dataset: Any, initial: list[Any], features: int, classes: int,
                  clip_norm: float) -> tuple[list[Any], list[float], list[float]]:
    """One device, SGD with momentum on the clipped gradient of each batch's in-batch softmax
    loss: the weights after each step, the losses and each step's gradient norm unclipped."""
    import keras

    from course_utils.models import mlp

    tf = _tf()
    reference = mlp(features, classes, hidden_units=(8,), name="check_step_reference")
    reference.set_weights(initial)
    optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    losses, norms, after = [], [], []
    for batch in dataset:
        with tf.GradientTape() as tape:
            loss = pair_loss(tf, reference, batch)
        grads, norm = tf.clip_by_global_norm(
            tape.gradient(loss, reference.trainable_variables), clip_norm)
        optimizer.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
        losses.append(float(loss))
        norms.append(float(norm))
        after.append(reference.get_weights())
    return after, losses, norms


class Flows:
    """What each replica trained on, as its update shows: the gradients that flow back
    through the model's Dense calls in the replicas (each call's weights noted on the way back,
    summed over the replicas) against the gradients handed to ``optimizer.apply`` (which
    ``apply_gradients`` calls; summed over the replicas, as Keras's ``_all_reduce_sum_gradients``
    sums them, keras/src/backend/tensorflow/optimizer.py lines 141-160, plus any handed over in
    the cross-replica context). Data parallelism: the applied sum is the flowed sum times one
    factor (the clip's; 1 in exercise 1's resumed run, whose calls of ``apply`` in the replicas
    are counted too). A forward pass written from the layers' weights flows back through no
    call: what it applies is left unexplained (lesson 02's reader: each replica gathered the
    global batch, ran the layers' kernels by hand and called the model on its slice for show)."""

    def __init__(self, tf: Any, strategy: Any, model: Any, optimizer: Any,
                 in_replica: Any) -> None:
        import keras

        layers = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
        self.weights = [w for layer in layers for w in (layer.kernel, layer.bias)]

        def summed() -> list[Any]:
            return [tf.Variable(tf.zeros(w.shape), trainable=False,
                                synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.SUM) for w in self.weights]

        with strategy.scope():
            self.flowed, self.applied = summed(), summed()
            self.calls = tf.Variable(0, trainable=False,  # apply's calls in the replicas
                                     synchronization=tf.VariableSynchronization.ON_READ,
                                     aggregation=tf.VariableAggregation.SUM)
        self.across = [tf.Variable(tf.zeros(w.shape), trainable=False) for w in self.weights]
        self.tf, self.in_replica = tf, in_replica
        for layer in layers:
            layer.call = self._flowing(layer)
        apply, index = optimizer.apply, {id(w): i for i, w in enumerate(self.weights)}

        def recorded(grads: Any, trainable_variables: Any = None) -> Any:
            grads = list(grads)
            variables = list(trainable_variables if trainable_variables is not None else
                             optimizer._trainable_variables)
            to = self.applied if in_replica() else self.across
            added = [to[index[id(v)]].assign_add(tf.convert_to_tensor(g))
                     for g, v in zip(grads, variables, strict=True)
                     if g is not None and id(v) in index]
            if in_replica():
                added.append(self.calls.assign_add(1))
            with tf.control_dependencies(added):
                return apply(grads, trainable_variables)

        optimizer.apply = recorded

    def _flowing(self, layer: Any) -> Any:
        tf, call = self.tf, layer.call
        at = {id(w): i for i, w in enumerate(self.weights)}  # by identity: == is elementwise
        totals = [self.flowed[at[id(w)]] for w in (layer.kernel, layer.bias)]

        def noted(value: Any, total: Any) -> Any:
            @tf.custom_gradient
            def identity(tensor: Any) -> Any:
                def backward(upstream: Any) -> Any:
                    if not self.in_replica():
                        return tf.identity(upstream)
                    with tf.control_dependencies([total.assign_add(upstream)]):
                        return tf.identity(upstream)

                return tf.identity(tensor), backward

            return identity(tf.convert_to_tensor(value))

        def flowing_call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.in_replica():
                return call(inputs, *args, **kwargs)
            kernel, bias = (noted(w, t) for w, t in zip((layer.kernel, layer.bias), totals,
                                                        strict=True))
            outputs = tf.matmul(inputs, kernel) + bias
            return outputs if layer.activation is None else layer.activation(outputs)

        return flowing_call

    def unexplained(self) -> float | None:
        """The part of this step's applied gradients (relative to their norm) that no factor
        times the flowed ones explains, None where the optimizer was handed none; the sums are
        then emptied."""
        import numpy as np

        applied = np.concatenate([(a.numpy() + x.numpy()).ravel()
                                  for a, x in zip(self.applied, self.across, strict=True)])
        flowed = np.concatenate([f.numpy().ravel() for f in self.flowed])
        for v in (*self.applied, *self.across, *self.flowed):
            v.assign(self.tf.zeros(v.shape))
        size = float(np.linalg.norm(applied))
        if size == 0.0:
            return None  # nothing applied (an update typed by hand: r02 L5)
        square = float(flowed @ flowed)
        scale = float(applied @ flowed) / square if square else 0.0
        return float(np.linalg.norm(applied - scale * flowed)) / size


def learner_run(fn: Any, strategy: Any, dataset: Any, initial: list[Any], features: int,
                classes: int, clip_norm: float
                ) -> tuple[list[Any], list[Any], list[bool], list[int], int, list[float | None]]:
    """The learner's step over the epoch in a ``tf.function``, the model and an SGD with
    momentum built in the scope: the weights after each step, the losses, per model call
    whether it ran in a replica, the optimizer's ``iterations`` after each step, the examples
    the first layer ran on in the replicas, and per step the part of the applied gradients
    that the gradients through the model's calls do not explain (:class:`Flows`)."""
    import keras

    from course_utils.models import mlp

    tf = _tf()
    with strategy.scope():
        learner = mlp(features, classes, hidden_units=(8,), name="check_step_learner")
        learner.set_weights(initial)
        optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
        optimizer.build(learner.trainable_variables)
        fed = tf.Variable(0, dtype=tf.int64, trainable=False,  # examples the replicas fed
                          synchronization=tf.VariableSynchronization.ON_READ,
                          aggregation=tf.VariableAggregation.SUM)
    contexts: list[bool] = []  # per traced call of the model: was it inside a replica?
    call, first = learner.call, learner.get_layer("dense_0")
    first_call = first.call

    def in_replica() -> bool:
        return tf.distribute.in_cross_replica_context() is False and tf.distribute.has_strategy()

    def recording_call(*args: Any, **kwargs: Any) -> Any:
        contexts.append(in_replica())
        return call(*args, **kwargs)

    def counting_call(*args: Any, **kwargs: Any) -> Any:
        # counted where the first layer sees the examples, as the step runs: a replica that
        # feeds more than its slice shows, through the model or through its layers (an answer
        # that ran model.layers on the whole batch in each replica passed a count at
        # model.call, 1 of 1)
        if in_replica():
            fed.assign_add(tf.cast(tf.shape(args[0])[0], tf.int64))
        return first_call(*args, **kwargs)

    flows = Flows(tf, strategy, learner, optimizer, in_replica)
    first_call = first.call  # noting the gradients that flow back through it
    learner.call, first.call = recording_call, counting_call

    @tf.function
    def step(batch: Any) -> Any:
        return fn(strategy, learner, optimizer, batch, clip_norm)

    losses, after, iterations, unexplained = [], [], [], []
    try:
        for batch in strategy.experimental_distribute_dataset(dataset):
            loss = step(batch)
            losses.append(None if loss is None else float(loss))
            after.append(learner.get_weights())
            iterations.append(int(optimizer.iterations.numpy()))
            unexplained.append(flows.unexplained())
    except NotImplementedError as error:
        raise AssertionError("your step calls a function that is not written yet – "
                             "write compute_loss first") from error
    return after, losses, contexts, iterations, int(fed.numpy()), unexplained


def verifier(dataset: Any, initial: list[Any], features: int, classes: int, clip_norm: float,
             replicas: int, batch_sizes: list[int]) -> Any:
    """``verify(result)``: the learner's run against the one-device reference, made now."""
    import numpy as np

    def verify(result: Any) -> str | None:
        got, losses, contexts, iterations, fed, unexplained = result
        expected, ref_losses, norms = reference_run(dataset, initial, features, classes,
                                                    clip_norm)
        if len(losses) != len(ref_losses) or any(v is None for v in losses):
            return "distributed_train_step must return the loss of the step (a scalar)"
        outside = contexts.count(False)
        if replicas > 1 and (outside or len(contexts) < replicas):
            return (f"the model was called {len(contexts)} times while the steps were traced, "
                    f"{outside} of them outside any replica (the cross-replica context), "
                    f"on {replicas} replicas: the forward pass of each replica's examples "
                    "runs in that replica")
        if fed > 2 * sum(batch_sizes):
            return (f"the replicas together ran the model on {fed} queries and keys in an "
                    f"epoch of {sum(batch_sizes)} pairs ({fed / (2 * sum(batch_sizes)):.3g}× "
                    "each query and key once): each replica embeds its own slice of the global "
                    "batch and no more (data parallelism: no replica computes the whole "
                    "batch; what the others embedded it can gather)")
        for step, (have, want) in enumerate(zip(losses, ref_losses, strict=True), start=1):
            if not np.isclose(have, want, rtol=1e-4, atol=1e-5):  # the weights before: equal
                last = " (the short last batch)" if step == len(ref_losses) else ""
                return (f"the loss of step {step}{last}, a batch of {batch_sizes[step - 1]} "
                        f"pairs, is {have:.6g}; one device gives the in-batch softmax loss "
                        f"{want:.6g} ({have / want:.3g}×)")
            worst = largest_difference(got[step - 1], expected[step - 1])
            if worst > 1e-5:
                return (f"after step {step} (a batch of {batch_sizes[step - 1]} pairs) the "
                        f"weights differ from one device's by up to {worst:.3g}: on one device "
                        f"that step's gradient had a global norm of {norms[step - 1]:.4g} "
                        f"(clip_norm {clip_norm:.4g}). Which gradient did your step clip, by "
                        "which norm, and which did the optimizer apply?")
        if None in unexplained:
            return (f"the weights are one device's, but at step {unexplained.index(None) + 1} "
                    "the optimizer you were given was handed no gradient (its apply_gradients "
                    "not called, in the replicas or across them): apply the update with it, "
                    "not by hand")
        worst = max(unexplained)
        if worst > 1e-3:
            step = unexplained.index(worst) + 1
            return (f"the weights are one device's, but at step {step} the optimizer was handed "
                    "gradients that the backward passes through the model's calls in the "
                    f"replicas do not explain ({100 * worst:.2g}% of their norm is left "
                    "over): each replica computes the gradient of its own slice by calling "
                    "the model on it, and the update is made from those gradients (a forward "
                    "pass written from the layers' weights, on more than the replica's slice, "
                    "is no replica's share of the work)")
        if iterations != list(range(1, len(ref_losses) + 1)):
            return (f"the weights are one device's, but the optimizer's iterations read "
                    f"{iterations} after steps 1 to {len(ref_losses)}: apply the update with "
                    "the optimizer you were given (its apply_gradients counts each step)")
        return None

    return verify
