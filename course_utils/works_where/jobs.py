"""One small training job per API, under a synchronous strategy; each returns the trained weights.

Every job builds the model and optimizer inside ``strategy.scope()`` from the task's initial
weights and trains one pass over the task's global batches, the way its lesson does. A correct
data-parallel run must then hold the weights of the one-device reference (``verdicts.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.works_where.cells import REMAT_ROWS
from course_utils.works_where.task import Task

__all__ = [
    "compiled_keras3",
    "replica_training",
    "fit_keras3",
    "fit_with_accumulation",
    "fit_steps_per_execution",
    "fit_jit_compile",
    "loss_scaled_loop",
    "keras_distribution_source",
    "overflow_on_last_replica_applied",
    "recomputed_loop",
    "fit_remat_scope",
    "custom_loop",
    "fit_trainer",
    "fit_tf_keras",
    "fit_keras_distribution",
    "variable_devices",
    "initialize_keras_distribution",
    "SYNC_JOBS",
]


def compiled_keras3(strategy: Any, task: Task, accumulation_steps: int | None = None,
                    remat: str | None = None, **compile_options: Any) -> Any:
    """A Keras 3 model built and compiled in the strategy's scope (SGD, cross-entropy), its
    layers made in ``keras.RematScope(**REMAT_MODES[remat])`` when ``remat`` names a row;
    ``compile_options`` such as ``steps_per_execution`` or ``jit_compile`` go to ``compile``."""
    import contextlib

    import keras

    from course_utils.works_where.cells import REMAT_MODES

    remat_scope = (keras.RematScope(**REMAT_MODES[remat]) if remat
                   else contextlib.nullcontext())
    with strategy.scope():
        with remat_scope:
            model = task.keras_model()
        model.compile(keras.optimizers.SGD(task.learning_rate,
                                           gradient_accumulation_steps=accumulation_steps),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      **compile_options)
    return model


def fit_keras3(strategy: Any, task: Task, accumulation_steps: int | None = None,
               remat: str | None = None, **compile_options: Any) -> list[Any]:
    """Keras 3 ``compile`` + ``fit`` in the strategy's scope (micro-batches when accumulating)."""
    model = compiled_keras3(strategy, task, accumulation_steps, remat, **compile_options)
    batch = task.global_batch // (accumulation_steps or 1)
    model.fit(task.dataset(batch), epochs=1, verbose=0, shuffle=False)
    return model.get_weights()


def fit_with_accumulation(strategy: Any, task: Task) -> list[Any]:
    """Keras's ``gradient_accumulation_steps=2`` over half-size batches: the same updates."""
    return fit_keras3(strategy, task, accumulation_steps=2)


def fit_steps_per_execution(strategy: Any, task: Task) -> list[Any]:
    """Keras 3 ``fit`` with ``steps_per_execution=2``: two steps per call (what TPUs want)."""
    return fit_keras3(strategy, task, steps_per_execution=2)


def fit_jit_compile(strategy: Any, task: Task) -> list[Any]:
    """Keras 3 ``fit`` with ``jit_compile=True``: the step compiled by XLA (always, on a TPU)."""
    return fit_keras3(strategy, task, jit_compile=True)


def replica_training(strategy: Any, task: Task, policy: str | None = None,
                     recompute: bool = False) -> tuple[Any, Any, Callable[[Any, Any], None]]:
    """The task's model and SGD optimizer built in the strategy's scope (a ``LossScaleOptimizer``
    under ``"mixed_float16"``) and one replica's step: ``GradientTape`` with
    ``compute_average_loss`` over the global batch, the model inside ``tf.recompute_grad`` with
    ``recompute`` (and the update then waiting for every gradient); the step returns whether
    this replica's (scaled) gradients were finite. The custom-loop jobs of every column share
    it."""
    import keras
    import tensorflow as tf

    from course_utils.training.precision import policy_scope

    with policy_scope(policy), strategy.scope():
        model = task.keras_model()
        optimizer = keras.optimizers.SGD(task.learning_rate)
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)  # in scope, before the first step
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def forward(x: Any) -> Any:
        return model(x, training=True)

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = tf.recompute_grad(forward)(x) if recompute else forward(x)
            per_example = loss_object(y, tf.cast(logits, tf.float32))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=task.global_batch)
            scaled = optimizer.scale_loss(loss)  # the loss itself without a LossScaleOptimizer
        gradients = tape.gradient(scaled, model.trainable_variables)
        # recomputed: the update waits for every gradient; without it, the optimized graph
        # sometimes updated a weight first (benchmarks/recompute_update_order.py)
        with tf.control_dependencies(gradients if recompute else []):
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])

    return model, optimizer, replica_step


def _custom_pass(strategy: Any, task: Task, policy: str | None = None,
                 recompute: bool = False) -> tuple[Any, list[int], list[int]]:
    """One pass of the custom loop: the model, the steps whose gradients overflowed (on any
    replica: all-reduced) and the steps a ``LossScaleOptimizer`` skipped (its scale halved;
    within one pass, far fewer steps than ``dynamic_growth_steps``, nothing else lowers it)."""
    import tensorflow as tf

    model, optimizer, replica_step = replica_training(strategy, task, policy, recompute)

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        def replica_overflowed(x: Any, y: Any) -> Any:  # this replica's step: 1 if not finite
            return tf.cast(tf.logical_not(replica_step(x, y)), tf.int32)

        return strategy.reduce("SUM", strategy.run(replica_overflowed, args=(x, y)), axis=None)

    def scale() -> float:
        return float(optimizer.dynamic_scale.numpy()) if policy == "mixed_float16" else 1.0

    overflowed, skipped = [], []
    for step, (x, y) in enumerate(strategy.experimental_distribute_dataset(task.dataset())):
        before = scale()
        if int(train_step(x, y)):  # replicas whose gradients were not finite
            overflowed.append(step)
        if scale() < before:
            skipped.append(step)
    return model, overflowed, skipped


def custom_loop(strategy: Any, task: Task, recompute: bool = False) -> list[Any]:
    """``strategy.run`` + ``GradientTape`` with ``compute_average_loss``; with ``recompute``,
    the model runs inside ``tf.recompute_grad``."""
    return _custom_pass(strategy, task, recompute=recompute)[0].get_weights()


def overflow_on_last_replica_applied(strategy: Any, task: Task) -> bool:
    """One ``LossScaleOptimizer`` step under ``mixed_float16`` (the row's policy) in which only
    the last replica's loss is infinite: True when the step was applied anyway (the weights
    became non-finite), False when it was skipped, as a loss scale must."""
    import keras
    import tensorflow as tf

    from course_utils.training.precision import policy_scope

    with policy_scope("mixed_float16"), strategy.scope():
        model = task.keras_model()
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(task.learning_rate))
        optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    last = strategy.num_replicas_in_sync - 1

    def replica_step(x: Any, y: Any) -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            per_example = loss_object(y, tf.cast(model(x, training=True), tf.float32))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=task.global_batch)
            loss = loss * tf.where(tf.equal(replica, last), float("inf"), 1.0)
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    x, y = next(iter(strategy.experimental_distribute_dataset(task.dataset())))
    tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))(x, y)
    return not all(np.isfinite(w).all() for w in model.get_weights())


def loss_scaled_loop(strategy: Any, task: Task) -> tuple[list[Any], list[int], list[int]]:
    """The custom loop under ``mixed_float16`` with a ``LossScaleOptimizer``, which scales the
    loss and unscales the gradients: the weights, the steps whose gradients overflowed and the
    steps it skipped (the check's reference skips those too, ``verdicts.check_loss_scaled``)."""
    model, overflowed, skipped = _custom_pass(strategy, task, policy="mixed_float16")
    return model.get_weights(), overflowed, skipped


def recomputed_loop(strategy: Any, task: Task) -> list[Any]:
    """The custom loop with the model's forward pass inside ``tf.recompute_grad``."""
    return custom_loop(strategy, task, recompute=True)


def fit_remat_scope(row: str) -> Any:
    """The job of one RematScope row: Keras 3 ``fit`` of a model whose layers were made in
    ``keras.RematScope`` with the row's mode (``cells.REMAT_MODES``)."""
    def job(strategy: Any, task: Task) -> list[Any]:
        return fit_keras3(strategy, task, remat=row)
    return job


def fit_trainer(strategy: Any, task: Task) -> list[Any]:
    """The course's ``cu.Trainer`` on the same global batches."""
    import keras

    from course_utils.training import Trainer

    trainer = Trainer(task.keras_model, lambda: keras.optimizers.SGD(task.learning_rate),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None),
                      strategy=strategy, verbose=0)
    trainer.fit(task.dataset())
    return trainer.model.get_weights()


def fit_tf_keras(strategy: Any, task: Task) -> list[Any]:
    """tf_keras (Keras 2) ``compile`` + ``fit`` in the strategy's scope."""
    import tf_keras

    with strategy.scope():
        model = task.tf_keras_model()
        model.compile(tf_keras.optimizers.SGD(task.learning_rate),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(task.dataset(), epochs=1, verbose=0, shuffle=False)
    return model.get_weights()


def variable_devices(variable: Any) -> set[str]:
    """The devices that hold a copy of ``variable`` (a Keras variable or a ``tf.Variable``),
    named like ``"CPU:0"``: each component of a distributed variable (a ``MirroredVariable``'s
    ``values``, whose own ``device`` is only the first's), every device of a DTensor
    variable's mesh when its layout is fully replicated, else the one device it is on."""
    import tensorflow as tf

    value = variable if isinstance(variable, tf.Variable) else variable.value  # Keras's
    if isinstance(value, tf.experimental.dtensor.DVariable):
        layout = tf.experimental.dtensor.fetch_layout(value)
        if layout.is_fully_replicated():
            return {device_name(d) for d in layout.mesh.local_devices()}
        return {device_name(value.device)}  # sharded: no device holds all of it
    components = getattr(value, "values", None)
    if isinstance(components, tuple):  # tf.distribute's DistributedValues
        return {device_name(component.device) for component in components}
    return {device_name(value.device)}


def device_name(device: str) -> str:
    """``"CPU:0"`` for ``"/job:localhost/.../device:CPU:0"``, ``"cpu:0"`` or ``"CPU:0"``."""
    return str(device).rsplit("device:", 1)[-1].upper()


def fit_keras_distribution(task: Task, devices: list[str]) -> tuple[list[Any], list[set[str]]]:
    """Keras 3 ``fit`` under ``keras.distribution.DataParallel(devices)``, no tf.distribute.

    Returns the trained weights and, per variable, the devices that hold a copy of it.
    """
    import keras

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    try:
        model = task.keras_model()
        placed = [variable_devices(v) for v in model.weights]
        model.compile(keras.optimizers.SGD(task.learning_rate),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(task.dataset(), epochs=1, verbose=0, shuffle=False)
    finally:
        keras.distribution.set_distribution(None)
    return [np.asarray(w) for w in model.get_weights()], placed


def initialize_keras_distribution() -> list[str]:
    """``keras.distribution``'s multi-process set-up, as ``initialize``'s docstring gives it:
    each process calls ``keras.distribution.initialize(job_addresses, num_processes,
    process_id)``, here with the workers' addresses and this process's index from its
    ``TF_CONFIG``, then trains over every device ``keras.distribution.list_devices()`` lists
    (returned). On the TensorFlow backend the call raises ``AttributeError`` before anything
    is bound: it calls the backend's ``distribution_lib.initialize``
    (``keras/src/distribution/distribution_lib.py`` line 151), which only the JAX backend's
    ``distribution_lib.py`` defines."""
    import json
    import os

    import keras

    config = json.loads(os.environ["TF_CONFIG"])
    workers = config["cluster"]["worker"]
    keras.distribution.initialize(job_addresses=",".join(workers),
                                  num_processes=len(workers),
                                  process_id=config["task"]["index"])
    return [str(device) for device in keras.distribution.list_devices()]


#: Row -> the job that trains it under a synchronous strategy.
SYNC_JOBS = {
    "keras3_fit": fit_keras3,
    "steps_per_execution": fit_steps_per_execution,
    "jit_compile": fit_jit_compile,
    "custom_loop": custom_loop,
    "trainer": fit_trainer,
    "tf_keras_fit": fit_tf_keras,
    "gradient_accumulation": fit_with_accumulation,
    "loss_scale_optimizer": loss_scaled_loop,
    "recompute_grad": recomputed_loop,
    **{row: fit_remat_scope(row) for row in REMAT_ROWS},
}


def keras_distribution_source() -> dict[str, bool]:
    """What the installed Keras's source says about ``keras.distribution`` on TensorFlow.

    ``backend_num_processes``: whether the TensorFlow backend's ``distribution_lib`` defines
    ``num_processes`` (``keras/src/backend/tensorflow/distribution_lib.py``);
    ``guarded``: whether ``Distribution.__init__`` asks ``hasattr(distribution_lib,
    "num_processes")`` before calling it (``keras/src/distribution/distribution_lib.py``).
    Without the function and without the guard, building any distribution raises
    ``AttributeError`` on TensorFlow: the traceback in keras-team/keras#18983 shows that call
    failing in ``ModelParallel.__init__``.
    """
    import importlib
    import inspect

    backend = importlib.import_module("keras.src.backend.tensorflow.distribution_lib")
    front = importlib.import_module("keras.src.distribution.distribution_lib")
    source = inspect.getsource(front.Distribution.__init__)
    return {"backend_num_processes": hasattr(backend, "num_processes"),
            "guarded": 'hasattr(distribution_lib, "num_processes")' in source}
