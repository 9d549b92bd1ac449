"""Checks of lesson 02's exercises (registered by name with ``@register``).

Strategies come from ``cu.make_strategy("mirrored")`` (every logical device of the kernel), the
same object the learner's notebook uses: a second MirroredStrategy over other devices in one
process would clash with the first one's collective all-reduces.
"""

from __future__ import annotations

from typing import Any

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, not_attempted, run_check

__all__ = [
    "check_build_and_compile",
    "check_compute_loss",
    "check_distributed_train_step",
    "check_warmup_learning_rate",
]


def _strategy() -> Any:
    from course_utils.strategies import make_strategy

    return make_strategy("mirrored", verbose=False)


def _tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras 3 variable (a MirroredVariable under a strategy)."""
    return getattr(variable, "value", variable)


def _device_key(tf: Any, device: str) -> tuple[str, int]:
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "", spec.device_index or 0)


# --- Exercise 1 · build and compile under the strategy --------------------------------------


@register
def check_build_and_compile(fn: Any) -> bool:
    """Check ``build_and_compile(strategy, num_features, num_classes)``.

    The model must be a compiled ``keras.Model`` whose variables are MirroredVariables with one
    copy on each of the strategy's devices, take ``num_features`` inputs, give ``num_classes``
    logits, and learn: a short ``fit`` on integer labels lowers its loss.
    """
    import keras
    import numpy as np

    from course_utils.data import teacher_classification

    tf = _tf()
    strategy = _strategy()
    rng = fresh_rng()
    num_features, num_classes = rng.randint(6, 16), rng.randint(3, 5)
    devices = sorted(_device_key(tf, d) for d in strategy.extended.worker_devices)

    def verify(model: Any) -> str | None:
        if not isinstance(model, keras.Model):
            return f"expected a keras.Model, got {type(model).__name__}"
        if not getattr(model, "compiled", False) or model.optimizer is None:
            return "the model is not compiled: call model.compile(optimizer=..., loss=...)"
        if not model.trainable_variables:
            return "the model has no trainable variables: is it built (keras.Input(...))?"
        for variable in model.trainable_variables + list(model.optimizer.variables):
            inner = _tf_variable(variable)
            name = getattr(variable, "path", getattr(variable, "name", "?"))
            if not isinstance(inner, tf.distribute.DistributedValues):
                return (f"variable {name!r} is a {type(inner).__name__} on one device, not a "
                        "MirroredVariable: it was created outside strategy.scope()")
            got = sorted(_device_key(tf, v.device) for v in inner.values)
            if got != devices:
                return (f"variable {name!r} has copies on {got}, expected one on each of the "
                        f"strategy's devices {devices}")
        x, y = teacher_classification(512, num_features, num_classes, seed=rng.randint(0, 999))
        try:
            logits = model(x[:4], training=False)
        except Exception as error:  # noqa: BLE001 - a wrong input size is the learner's bug
            return (f"calling the model on inputs of shape (4, {num_features}) failed: "
                    f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        if tuple(logits.shape) != (4, num_classes):
            return (f"the model's output for 4 examples has shape {tuple(logits.shape)}, "
                    f"expected (4, {num_classes}) (one logit per class)")
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
        history = model.fit(dataset, epochs=4, verbose=0, shuffle=False)
        losses = [float(v) for v in history.history["loss"]]
        if not np.all(np.isfinite(losses)):
            return f"the loss is not finite during fit: {losses}"
        if not losses[-1] < losses[0]:
            return (f"the loss did not fall in 4 epochs of fit ({losses[0]:.4f} -> "
                    f"{losses[-1]:.4f}): check the loss (integer labels, logits) and the "
                    "learning rate")
        return None

    case = Case(args=(strategy, num_features, num_classes),
                label=f"(strategy, num_features={num_features}, num_classes={num_classes})",
                verify=verify)
    return run_check("build_and_compile", fn, [case],
                     hint="create and compile the model inside `with strategy.scope():`; the "
                          "labels are integers and the last layer gives logits, so use "
                          "keras.losses.SparseCategoricalCrossentropy(from_logits=True).")


# --- Exercise 2 · the loss and the distributed train step -----------------------------------


def _reference_loss(labels: Any, logits: Any, global_batch_size: int) -> float:
    import numpy as np

    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    per_example = -log_probs[np.arange(len(labels)), labels]
    return float(per_example.astype(np.float64).sum() / global_batch_size)


@register
def check_compute_loss(fn: Any) -> bool:
    """Check ``compute_loss(labels, logits, global_batch_size)``: per-example cross-entropy
    summed over this replica's examples, divided by the global batch size."""
    import numpy as np

    tf = _tf()
    rng = fresh_rng()
    np_rng = np.random.default_rng(rng.randint(0, 2**31))
    cases = []
    for replicas in (1, 4, rng.choice([2, 8])):
        local = rng.randint(3, 16)
        classes = rng.randint(2, 6)
        global_batch = local * replicas
        labels = np_rng.integers(0, classes, size=local).astype(np.int32)
        logits = np_rng.normal(size=(local, classes)).astype(np.float32)
        cases.append(Case(
            args=(tf.constant(labels), tf.constant(logits), global_batch),
            expected=_reference_loss(labels, logits, global_batch),
            label=f"({local} labels, logits of shape {logits.shape}, "
                  f"global_batch_size={global_batch})"))
    return run_check("compute_loss", fn, cases, rtol=1e-5, atol=1e-6,
                     hint="divide by the global batch, not by this replica's batch: "
                          "tf.nn.compute_average_loss(per_example_losses, "
                          "global_batch_size=global_batch_size), with the keyword (passed "
                          "positionally it becomes a sample weight). tf.reduce_mean averages "
                          "per replica and makes the summed gradient N× too large.")


@register
def check_distributed_train_step(fn: Any, num_steps: int = 3) -> bool:
    """Check ``distributed_train_step(strategy, model, optimizer, batch, global_batch_size)``.

    A few steps under ``cu.make_strategy("mirrored")`` must give the same weights (within
    1e-5) and losses as plain SGD on one device over the same global batches.
    """
    import keras
    import numpy as np

    from course_utils.data import teacher_classification
    from course_utils.models import mlp

    tf = _tf()
    strategy = _strategy()
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    per_replica = rng.choice([4, 8])
    global_batch = per_replica * replicas
    features, classes, learning_rate = 8, 3, 0.5
    x, y = teacher_classification(global_batch * num_steps, features, classes,
                                  seed=rng.randint(0, 999))
    keras.utils.set_random_seed(rng.randint(0, 2**31 - 1))
    initial = mlp(features, classes, hidden_units=(16,), name="reference").get_weights()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)

    # The one-device reference: the mean loss over each global batch, plain SGD.
    reference = mlp(features, classes, hidden_units=(16,), name="reference")
    reference.set_weights(initial)
    ref_optimizer = keras.optimizers.SGD(learning_rate)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ref_losses, ref_first = [], None
    for xb, yb in dataset:
        with tf.GradientTape() as tape:
            loss = cross_entropy(yb, reference(xb, training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_optimizer.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
        ref_losses.append(float(loss))
        ref_first = ref_first or reference.get_weights()
    expected = reference.get_weights()

    def verify(result: Any) -> str | None:
        got, first, losses = result
        if len(losses) != num_steps or any(v is None for v in losses):
            return "distributed_train_step must return the loss of the step (a scalar)"
        # The size of the first update against the reference's: exactly ×N for a loss
        # averaged per replica (plain SGD is linear in the gradient).
        moved = sum(float(np.sum((g - w0) ** 2)) for g, w0 in zip(first, initial, strict=True))
        wanted = sum(float(np.sum((e - w0) ** 2)) for e, w0 in zip(ref_first, initial,
                                                                  strict=True))
        worst = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected, strict=True))
        if worst > 1e-5:
            if moved == 0.0:
                return "the weights did not change: apply the gradients with the optimizer"
            ratio = (moved / wanted) ** 0.5 if wanted else float("inf")
            return (f"after {num_steps} steps on {replicas} replicas the weights differ from "
                    f"the one-device reference by up to {worst:.3g}; your first update is "
                    f"{ratio:.3g}× the reference's size (×{replicas} means the loss was "
                    "averaged per replica)")
        for step, (have, want) in enumerate(zip(losses, ref_losses, strict=True), start=1):
            if not np.isclose(have, want, rtol=1e-4, atol=1e-5):
                return (f"the returned loss of step {step} is {have:.6g}, expected the mean "
                        f"loss of the global batch {want:.6g} ({have / want:.3g}×): sum the "
                        "replicas' losses with strategy.reduce(ReduceOp.SUM, ...)")
        return None

    def run_learner(step_fn: Any) -> Any:
        with strategy.scope():
            model = mlp(features, classes, hidden_units=(16,), name="learner")
            model.set_weights(initial)
            optimizer = keras.optimizers.SGD(learning_rate)
            optimizer.build(model.trainable_variables)

        @tf.function
        def step(batch: Any) -> Any:
            return step_fn(strategy, model, optimizer, batch, global_batch)

        losses, first = [], None
        for batch in strategy.experimental_distribute_dataset(dataset):
            loss = step(batch)
            losses.append(None if loss is None else float(loss))
            first = first or model.get_weights()
        return model.get_weights(), first, losses

    def wrapped(strategy_arg: Any, *_: Any) -> Any:
        # Run the learner's function (stubs raise NotImplementedError from inside it).
        return run_learner(fn)

    if _is_stub(fn, strategy):
        not_attempted("distributed_train_step")
        return False
    case = Case(args=(strategy,),
                label=f"({num_steps} steps, {replicas} replicas, global batch {global_batch})",
                verify=verify)
    return run_check("distributed_train_step", wrapped, [case],
                     hint="in a replica function: forward pass under a GradientTape, "
                          "compute_loss(labels, logits, global_batch_size), gradients, "
                          "optimizer.apply_gradients; then strategy.run(replica_fn, "
                          "args=batch) and strategy.reduce(tf.distribute.ReduceOp.SUM, "
                          "per_replica_losses, axis=None).")


def _is_stub(fn: Any, strategy: Any) -> bool:
    """True when ``fn`` still holds its stub: called with placeholders, it raises its own
    NotImplementedError (a real attempt fails on the placeholders some other way, or not at
    all). The check runs the function inside a tf.function, where a stub could not be told
    from an error, so it looks first."""
    try:
        fn(strategy, None, None, None, 0)
    except NotImplementedError as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is not None and tb.tb_frame.f_code is getattr(fn, "__code__", None)
    except Exception:  # noqa: BLE001 - a real attempt fails on the placeholders: fine
        return False
    return False


# --- Exercise 3 · learning rate for N replicas, with warm-up --------------------------------


def _reference_warmup(step: int, base_learning_rate: float, base_batch_size: int,
                      per_replica_batch_size: int, num_replicas: int,
                      warmup_steps: int) -> float:
    target = base_learning_rate * per_replica_batch_size * num_replicas / base_batch_size
    if step >= warmup_steps:
        return target
    return base_learning_rate + (target - base_learning_rate) * step / warmup_steps


@register
def check_warmup_learning_rate(fn: Any) -> bool:
    """Check ``warmup_learning_rate(step, base_learning_rate, base_batch_size,
    per_replica_batch_size, num_replicas, warmup_steps)``."""
    rng = fresh_rng()
    cases = []
    settings = [(0.1, 256, 64, 8, 100)]  # global batch 512: the target is 0.2
    for _ in range(3):
        settings.append((round(10 ** rng.uniform(-4, -1), 6), rng.choice([32, 64, 128, 256]),
                         rng.choice([16, 32, 64, 128]), rng.choice([1, 2, 4, 8, 16]),
                         rng.randint(5, 500)))
    for base_lr, base_batch, per_replica, replicas, warmup in settings:
        for step in (0, warmup // 3, warmup - 1, warmup, warmup + rng.randint(1, 1000)):
            args = (step, base_lr, base_batch, per_replica, replicas, warmup)
            cases.append(Case(args=args, expected=_reference_warmup(*args)))
    no_warmup = (rng.randint(0, 50), 0.05, 128, 32, 8, 0)
    cases.append(Case(args=no_warmup, expected=_reference_warmup(*no_warmup)))
    return run_check("warmup_learning_rate", fn, cases, rtol=1e-6, atol=1e-12,
                     hint="target = base_learning_rate × global_batch_size / base_batch_size, "
                          "with global_batch_size = per_replica_batch_size × num_replicas; "
                          "before warmup_steps, go linearly from base_learning_rate (step 0) "
                          "to the target (step warmup_steps); from then on, the target. "
                          "warmup_steps=0 means no warm-up.")
