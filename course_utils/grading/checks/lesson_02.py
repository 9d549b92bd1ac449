"""Checks of lesson 02's exercises (registered by name with ``@register``).

Strategies come from ``cu.make_strategy("mirrored")`` (every logical device of the kernel), the
same object the learner's notebook uses: a second MirroredStrategy over other devices in one
process would clash with the first one's collective all-reduces.
"""

from __future__ import annotations

from typing import Any

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks import sharding
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, not_attempted, run_check

__all__ = ["DIAGNOSES", "check_build_and_compile", "check_compute_loss",
           "check_diagnose_reduction", "check_distribute_dataset",
           "check_distributed_train_step"]


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


# --- Exercise 2 · the loss, right on every batch, and the distributed train step ------------


def _reference_loss(labels: Any, logits: Any, global_batch_size: int) -> float:
    import numpy as np

    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    per_example = -log_probs[np.arange(len(labels)), labels]
    return float(per_example.astype(np.float64).sum() / global_batch_size)


def _raises_own_stub(fn: Any, *args: Any) -> bool:
    """True when ``fn(*args)`` raises the NotImplementedError of its own stub.

    A real attempt may fail on the placeholder arguments in any other way, or not at all. The
    checks run the learner's code inside ``tf.function``, where a stub could not be told from an
    error, so they look first.
    """
    try:
        fn(*args)
    except NotImplementedError as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is not None and tb.tb_frame.f_code is getattr(fn, "__code__", None)
    except Exception:  # noqa: BLE001 - a real attempt fails on the placeholders: fine
        return False
    return False


def _small_model(strategy: Any, rng: Any, name: str) -> tuple[Any, Any, Any, int, int]:
    """A small classifier built in the scope, data for it, and its sizes."""
    import keras

    from course_utils.data import teacher_classification
    from course_utils.models import mlp

    features, classes = rng.randint(4, 10), rng.randint(2, 5)
    x, y = teacher_classification(256, features, classes, seed=rng.randint(0, 999))
    keras.utils.set_random_seed(rng.randint(0, 2**31 - 1))
    with strategy.scope():
        model = mlp(features, classes, hidden_units=(8,), name=name)
    return model, x, y, features, classes


def _per_example_loss() -> Any:
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


@register
def check_compute_loss(fn: Any) -> bool:
    """Check ``compute_loss(labels, logits)``, called inside a replica.

    It must be this replica's share of the mean loss over the examples the global batch really
    has: outside any strategy, the plain mean; under the strategy, summed over the replicas,
    the one-device mean and gradient, on a full global batch and on short ones split unevenly
    (some replicas with fewer examples, or none).
    """
    import numpy as np

    from course_utils.reductions import measure_reductions

    tf = _tf()
    if _raises_own_stub(fn, tf.constant([0, 1]), tf.zeros((2, 3))):
        not_attempted("compute_loss")
        return False
    strategy = _strategy()
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    np_rng = np.random.default_rng(rng.randint(0, 2**31))
    model, x, y, _, classes = _small_model(strategy, rng, "check_compute_loss")
    global_batch = rng.choice([4, 8]) * replicas
    local = rng.randint(3, 12)
    plain_labels = np_rng.integers(0, classes, size=local).astype(np.int32)
    plain_logits = np_rng.normal(size=(local, classes)).astype(np.float32)

    def run(kind: str, *args: Any) -> Any:
        if kind == "plain":
            return fn(*args)
        size = args[0]
        return measure_reductions(strategy, model, {"yours": fn}, (x[:size], y[:size]),
                                  _per_example_loss())["yours"]

    def verify_split(size: int) -> Any:
        def verify(measured: Any) -> str | None:
            if measured.right:
                return None
            return (f"split over {replicas} replicas as {measured.examples_per_replica}, "
                    f"the replicas' summed gradient is {measured.gradient_ratio:.4g}× the "
                    f"one-device gradient of the mean loss over these {size} examples (and the "
                    f"summed loss {measured.loss_sum_ratio:.4g}× the mean loss)")
        return verify

    cases = [Case(args=("plain", tf.constant(plain_labels), tf.constant(plain_logits)),
                  expected=_reference_loss(plain_labels, plain_logits, local),
                  label=f"(outside any strategy: {local} labels, logits {plain_logits.shape})")]
    for size in (global_batch, replicas + 1, global_batch + 1 - replicas):
        cases.append(Case(args=("strategy", size), verify=verify_split(size),
                          label=f"(inside {replicas} replicas, a global batch of {size})"))
    return run_check("compute_loss", run, cases, rtol=1e-5, atol=1e-6,
                     hint="count the examples of the whole global batch inside the replica: "
                          "tf.distribute.get_replica_context().all_reduce("
                          "tf.distribute.ReduceOp.SUM, tf.shape(labels)[0]); then "
                          "tf.nn.compute_average_loss(per_example_losses, "
                          "global_batch_size=that count) – with the keyword (lesson 02, "
                          "section 5: the last row of the table).")


@register
def check_distributed_train_step(fn: Any, num_full_batches: int = 2) -> bool:
    """Check ``distributed_train_step(strategy, model, optimizer, batch)``.

    An epoch of full global batches and a short, unevenly split last one under
    ``cu.make_strategy("mirrored")`` must give the same weights (within 1e-5) and losses as
    plain SGD on one device over the same batches.
    """
    import keras
    import numpy as np

    from course_utils.models import mlp

    tf = _tf()
    strategy = _strategy()
    if _raises_own_stub(fn, strategy, None, None, None):
        not_attempted("distributed_train_step")
        return False
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    model, x, y, features, classes = _small_model(strategy, rng, "check_step_initial")
    initial = model.get_weights()
    global_batch = rng.choice([4, 8]) * replicas
    size = global_batch * num_full_batches + replicas + 1  # a short, uneven last batch
    dataset = tf.data.Dataset.from_tensor_slices((x[:size], y[:size])).batch(global_batch)
    learning_rate = 0.5

    # The one-device reference: the mean loss over each batch, plain SGD.
    reference = mlp(features, classes, hidden_units=(8,), name="check_step_reference")
    reference.set_weights(initial)
    ref_optimizer = keras.optimizers.SGD(learning_rate)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ref_losses = []
    for xb, yb in dataset:
        with tf.GradientTape() as tape:
            loss = cross_entropy(yb, reference(xb, training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_optimizer.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
        ref_losses.append(float(loss))
    expected = reference.get_weights()
    batch_sizes = [min(global_batch, size - i * global_batch) for i in range(len(ref_losses))]

    def verify(result: Any) -> str | None:
        got, losses = result
        if len(losses) != len(ref_losses) or any(v is None for v in losses):
            return "distributed_train_step must return the loss of the step (a scalar)"
        for step, (have, want) in enumerate(zip(losses, ref_losses, strict=True), start=1):
            if not np.isclose(have, want, rtol=1e-4, atol=1e-5):
                last = " (the short last batch)" if step == len(ref_losses) else ""
                return (f"the loss of step {step}{last}, a batch of {batch_sizes[step - 1]} "
                        f"examples, is {have:.6g}; one device gives the mean loss {want:.6g} "
                        f"({have / want:.3g}×). Sum the replicas' losses with "
                        "strategy.reduce(tf.distribute.ReduceOp.SUM, ...) and let "
                        "compute_loss count the examples")
        worst = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected, strict=True))
        if worst > 1e-5:
            return (f"after {len(ref_losses)} steps (the last one short) the weights differ "
                    f"from the one-device reference by up to {worst:.3g}: apply the gradients "
                    "of compute_loss with the optimizer, once per step")
        return None

    def run_learner(strategy_arg: Any) -> Any:
        with strategy.scope():
            learner = mlp(features, classes, hidden_units=(8,), name="check_step_learner")
            learner.set_weights(initial)
            optimizer = keras.optimizers.SGD(learning_rate)
            optimizer.build(learner.trainable_variables)

        @tf.function
        def step(batch: Any) -> Any:
            return fn(strategy_arg, learner, optimizer, batch)

        losses = []
        try:
            for batch in strategy.experimental_distribute_dataset(dataset):
                loss = step(batch)
                losses.append(None if loss is None else float(loss))
        except NotImplementedError as error:
            raise AssertionError("your step calls a function that is not written yet – "
                                 "write compute_loss first") from error
        return learner.get_weights(), losses

    case = Case(args=(strategy,), verify=verify,
                label=f"({len(batch_sizes)} steps on {replicas} replicas, batches of "
                      f"{batch_sizes} examples)")
    return run_check("distributed_train_step", run_learner, [case],
                     hint="in a replica function: forward pass under a GradientTape, "
                          "compute_loss(labels, logits), gradients, "
                          "optimizer.apply_gradients; then strategy.run(replica_fn, "
                          "args=batch) and strategy.reduce(tf.distribute.ReduceOp.SUM, "
                          "per_replica_losses, axis=None) (lesson 02, section 4).")


# --- Exercise 3 · diagnose a loss reduction from its symptom --------------------------------

#: The answers ``diagnose_reduction`` may give, one per reduction of lesson 02's section 5.
DIAGNOSES = (
    "right",
    "reduce_mean per replica",
    "global_batch_size passed positionally",
    "loss reported with ReduceOp.MEAN",
    "constant global_batch_size on a short batch",
    "Keras loss object on an uneven split",
)


def _symptoms(strategy: Any, rng: Any) -> list[tuple[tuple[float, float, tuple[int, ...], int],
                                                     str]]:
    """Real symptoms: each reduction measured on a full and a short batch, with its cause."""
    from course_utils.reductions import measure_reductions

    tf = _tf()
    replicas = strategy.num_replicas_in_sync
    model, x, y, _, _ = _small_model(strategy, rng, "check_diagnose")
    global_batch = rng.choice([4, 8]) * replicas
    per_example = _per_example_loss()
    import keras

    def constant(labels: Any, logits: Any) -> Any:
        return tf.nn.compute_average_loss(per_example(labels, logits),
                                          global_batch_size=global_batch)

    def counted(labels: Any, logits: Any) -> Any:
        examples = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
        return tf.nn.compute_average_loss(per_example(labels, logits),
                                          global_batch_size=examples)

    losses = {
        "constant": constant, "counted": counted,
        "mean": lambda labels, logits: tf.reduce_mean(per_example(labels, logits)),
        "positional": lambda labels, logits: tf.nn.compute_average_loss(
            per_example(labels, logits), global_batch),
        "keras": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    }
    full = measure_reductions(strategy, model, losses, (x[:global_batch], y[:global_batch]),
                              per_example)
    short_size = replicas + 1
    short = measure_reductions(strategy, model, losses, (x[:short_size], y[:short_size]),
                               per_example)

    def symptom(m: Any, loss_ratio: float | None = None) -> tuple[float, float, tuple, int]:
        return (round(m.gradient_ratio, 6), round(m.loss_sum_ratio if loss_ratio is None
                                                  else loss_ratio, 6),
                m.examples_per_replica, global_batch)

    cases = [(symptom(full["constant"]), "right"), (symptom(short["counted"]), "right"),
             (symptom(full["positional"]), "global_batch_size passed positionally"),
             (symptom(short["constant"]), "constant global_batch_size on a short batch")]
    if replicas > 1:  # with one replica these look exactly like the right reduction
        cases += [(symptom(full["mean"]), "reduce_mean per replica"),
                  (symptom(full["counted"], full["counted"].loss_mean_ratio),
                   "loss reported with ReduceOp.MEAN"),
                  (symptom(short["keras"]), "Keras loss object on an uneven split")]
    rng.shuffle(cases)
    return cases


@register
def check_diagnose_reduction(fn: Any) -> bool:
    """Check ``diagnose_reduction(gradient_ratio, loss_ratio, examples_per_replica,
    global_batch_size)``: given what a training step measured against one device, it names the
    reduction (one of ``DIAGNOSES``). The symptoms are measured for real, on fresh data."""
    if _raises_own_stub(fn, 1.0, 1.0, (8, 8), 16):
        not_attempted("diagnose_reduction")
        return False
    rng = fresh_rng()
    cases = []
    for (gradient_ratio, loss_ratio, split, global_batch), cause in _symptoms(_strategy(), rng):
        def verify(answer: Any, cause: str = cause) -> str | None:
            if not isinstance(answer, str) or answer not in DIAGNOSES:
                return f"answer one of DIAGNOSES, got {answer!r}"
            return None if answer == cause else f"this is {cause!r}, not {answer!r}"

        cases.append(Case(args=(gradient_ratio, loss_ratio, split, global_batch), verify=verify,
                          label=f"(gradient ×{gradient_ratio:.4g}, loss ×{loss_ratio:.4g}, "
                                f"examples per replica {split}, global batch {global_batch})"))
    return run_check("diagnose_reduction", fn, cases,
                     hint="compare the ratios with 1, with the number of replicas "
                          "(len(examples_per_replica)), with global_batch_size and with the "
                          "examples the batch really has (sum(examples_per_replica)) / "
                          "global_batch_size; a right gradient with a loss 1/N too small is a "
                          "reporting mistake. Lesson 02, section 5: the table and what it says.")


# --- Exercise 4 · distribute a dataset, one pipeline per worker ------------------------------


@register
def check_distribute_dataset(fn: Any) -> bool:
    """Check ``distribute(strategy, examples, global_batch_size)``.

    Under ``cu.make_strategy("mirrored")`` an epoch whose last global batch is short must give
    every example exactly once, ``global_batch_size / replicas`` per replica on every full step;
    under a stand-in two-worker strategy each worker's pipeline must read its own shard, in
    per-replica batches.
    """
    tf = _tf()
    strategy = _strategy()
    if _raises_own_stub(fn, strategy, tf.data.Dataset.range(4), 4):
        not_attempted("distribute_dataset")
        return False
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    per_replica = rng.choice([3, 4, 5])
    global_batch = per_replica * replicas
    size = global_batch * rng.randint(2, 4) + rng.randint(1, global_batch - 1)

    def run(kind: str, replicas_per_worker: int = 0) -> Any:
        examples = tf.data.Dataset.range(size)
        if kind == "strategy":
            return sharding.steps_on(strategy, fn(strategy, examples, global_batch))
        workers = sharding.TwoWorkers(replicas_per_worker)
        pipelines = fn(workers, examples, per_replica * workers.num_replicas_in_sync)
        return [sharding.batches(pipeline) for pipeline in pipelines]

    verify_strategy = sharding.epoch_verifier(size, global_batch, per_replica, replicas)
    verify_workers = sharding.workers_verifier(size, per_replica)

    cases = [Case(args=("strategy",), verify=verify_strategy,
                  label=f"({size} examples, global batch {global_batch}, {replicas} "
                        "replicas: the last batch short)"),
             Case(args=("workers", 2), verify=verify_workers,
                  label=f"(2 workers × 2 replicas, {size} examples, per-replica batch "
                        f"{per_replica})")]
    return run_check("distribute_dataset", run, cases,
                     hint="strategy.distribute_datasets_from_function(dataset_fn), where "
                          "dataset_fn(input_context) takes examples.shard("
                          "input_context.num_input_pipelines, input_context.input_pipeline_id)"
                          " and batches it by input_context.get_per_replica_batch_size("
                          "global_batch_size) (lesson 02, section 9: auto-sharding).")
