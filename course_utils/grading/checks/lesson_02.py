"""Checks of lesson 02's exercises (registered by name with ``@register``): a checkpoint
saved under one strategy and restored under another, the loss and the distributed step, a
training loop diagnosed from what it does, a dataset distributed by hand.

Strategies come from ``cu.make_strategy("mirrored")``, the learner's own object: a second
MirroredStrategy over other devices would clash with its collective all-reduces.
"""

from __future__ import annotations

from typing import Any

from course_utils.equality import largest_difference
from course_utils.grading.checks import sharding
from course_utils.grading.checks.loops import DIAGNOSES, loop_with
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, not_attempted, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["DIAGNOSES", "check_compute_loss", "check_diagnose_loop", "check_distribute_dataset",
           "check_distributed_train_step", "check_save_and_restore"]


def _strategy() -> Any:
    from course_utils.strategies import make_strategy

    return make_strategy("mirrored", verbose=False)


def _tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras 3 variable (a MirroredVariable under a strategy)."""
    return getattr(variable, "value", variable)


def _device_key(tf: Any, device: str) -> tuple[str, int]:
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "", spec.device_index or 0)


# --- Exercise 1 · a checkpoint that outlives the strategy --------------------------------------


def _trained_pair(strategy: Any, rng: Any, under_strategy: bool, name: str) -> tuple[Any, ...]:
    """A small model and its Adam, trained 3 steps (under ``strategy`` or on one device)."""
    import keras

    tf = _tf()
    context = strategy if under_strategy else tf.distribute.get_strategy()
    model, x, y, features, classes = _small_model(context, rng, name)
    with context.scope():
        optimizer = keras.optimizers.Adam(learning_rate=0.01)
        optimizer.build(model.trainable_variables)
    per_example = _per_example_loss()
    global_batch = 8 * context.num_replicas_in_sync

    def replica_step(xb: Any, yb: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    step = tf.function(lambda batch: context.run(replica_step, args=batch))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    for batch in context.experimental_distribute_dataset(dataset.take(3)):
        step(batch)
    return model, optimizer, features, classes


@register
def check_save_and_restore(fn: Any) -> bool:
    """Check ``save_and_restore(model, optimizer, directory, build_fresh)``.

    A model and its Adam trained under the strategy must come back, through a TensorFlow
    checkpoint written into ``directory``, into the fresh one-device pair ``build_fresh()``
    returns – and the other way round: trained on one device, restored under the strategy.
    Weights, Adam's moments and step must equal the trained pair's; ``build_fresh()`` zeroes
    that pair (another machine), so values copied from it come back as zeros.
    """
    import glob
    import tempfile

    import keras
    import numpy as np

    from course_utils.models import mlp

    tf = _tf()
    strategy = _strategy()
    if _raises_own_stub(fn, None, None, None, None):
        not_attempted("save_and_restore")
        return False
    rng = fresh_rng()

    def run(trained_under_strategy: bool) -> Any:
        model, optimizer, features, classes = _trained_pair(
            strategy, rng, trained_under_strategy, "check_saved")
        fresh: list[Any] = []
        saved = {"weights": model.get_weights(), "optimizer state": [
            np.asarray(v) for v in optimizer.variables]}

        def build_fresh() -> tuple[Any, Any]:
            for variable in [*model.variables, *optimizer.variables]:
                variable.assign(np.zeros(variable.shape, variable.dtype))
            context = tf.distribute.get_strategy() if trained_under_strategy else strategy
            with context.scope():
                fresh_model = mlp(features, classes, hidden_units=(8,), name="check_restored")
                fresh_optimizer = keras.optimizers.Adam(learning_rate=0.01)
                fresh_optimizer.build(fresh_model.trainable_variables)
            fresh[:] = [fresh_model, fresh_optimizer]
            return fresh_model, fresh_optimizer

        with tempfile.TemporaryDirectory(prefix="check_02_") as directory:
            returned = fn(model, optimizer, directory, build_fresh)
            written = glob.glob(f"{directory}/**/*.index", recursive=True)
        return returned, fresh, written, saved

    def verify(result: Any) -> str | None:
        returned, fresh, written, saved = result
        if not written:
            return ("no TensorFlow checkpoint (an .index file) was written into directory: "
                    "tf.train.Checkpoint(model=..., optimizer=...).write(path inside directory)")
        if not fresh:
            return "build_fresh() was never called: restore into the pair it returns"
        if not (isinstance(returned, (tuple, list)) and len(returned) == 2
                and returned[0] is fresh[0] and returned[1] is fresh[1]):
            return "return the (model, optimizer) that build_fresh() gave you, restored"
        states = {"weights": fresh[0].get_weights(),
                  "optimizer state": [np.asarray(v) for v in fresh[1].variables]}
        for name, restored in states.items():
            if len(saved[name]) != len(restored) or any(not np.array_equal(a, b) for a, b in
                                                        zip(saved[name], restored, strict=True)):
                return (f"the restored {name} differ from the saved ones: save the model and "
                        "the optimizer in one tf.train.Checkpoint and read it into the fresh "
                        "pair (Adam's step count and moments are part of the state)")
        return None

    cases = [Case(args=(True,), verify=verify,
                  label=f"(trained on {strategy.num_replicas_in_sync} replicas, restored on one "
                        "device)"),
             Case(args=(False,), verify=verify,
                  label=f"(trained on one device, restored under {strategy.num_replicas_in_sync} "
                        "replicas)")]
    return run_check("save_and_restore", run, cases,
                     hint="path = tf.train.Checkpoint(model=model, optimizer=optimizer).write("
                          "os.path.join(directory, 'ckpt')); then fresh_model, fresh_optimizer = "
                          "build_fresh(); tf.train.Checkpoint(model=fresh_model, optimizer="
                          "fresh_optimizer).read(path) (lesson 02, section 4: the checkpoint).")


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
        worst = largest_difference(got, expected)
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


# --- Exercise 3 · diagnose a training loop from its symptoms -----------------------------------


@register
def check_diagnose_loop(fn: Any) -> bool:
    """Check ``diagnose_loop(strategy, make_train_step, build_model, features, labels,
    global_batch_size)``: given a training step as a black box, it runs it and names its loss
    reduction (one of ``DIAGNOSES``). Every mistake of lesson 02's section 5 is asked about,
    each a real loop, on fresh data."""
    from course_utils.data import teacher_classification
    from course_utils.models import mlp

    strategy = _strategy()
    if _raises_own_stub(fn, strategy, None, None, None, None, 8):
        not_attempted("diagnose_loop")
        return False
    replicas = strategy.num_replicas_in_sync
    rng = fresh_rng()
    kinds = list(DIAGNOSES) if replicas > 1 else [  # one replica: these look right
        "right", "global_batch_size passed positionally",
        "constant global_batch_size on a short batch"]
    rng.shuffle(kinds)
    cases = []
    for kind in kinds:
        num_features, classes = rng.randint(4, 8), rng.randint(2, 4)
        x, y = teacher_classification(64, num_features, classes, seed=rng.randint(0, 999))
        global_batch = rng.choice([4, 8]) * replicas

        def build_model(num_features: int = num_features, classes: int = classes) -> Any:
            return mlp(num_features, classes, hidden_units=(8,), name="check_diagnose")

        def verify(answer: Any, kind: str = kind) -> str | None:
            if not isinstance(answer, str) or answer not in DIAGNOSES:
                return f"answer one of DIAGNOSES, got {answer!r}"
            return None if answer == kind else f"this loop is {kind!r}, not {answer!r}"

        cases.append(Case(args=(strategy, loop_with(strategy, kind, global_batch), build_model,
                                x, y, global_batch), verify=verify,
                          label=f"(a loop written for a global batch of {global_batch}, "
                                f"{replicas} replicas, {num_features} features, {classes} "
                                "classes)"))
    return run_check("diagnose_loop", fn, cases,
                     hint="build the model and a plain SGD(learning_rate=1.0) in the scope, run "
                          "one step on a full global batch and one on a short batch of "
                          "replicas + 1 examples; the weights move by minus the gradient the "
                          "loop applied. Divide it by the one-device gradient of the mean loss "
                          "(same initial weights), and the reported loss by the true mean "
                          "loss. Lesson 02, section 5: the table says which ratio means what.")


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
