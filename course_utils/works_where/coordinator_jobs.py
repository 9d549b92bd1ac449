"""The jobs under ``ParameterServerStrategy``: steps scheduled on workers with a coordinator.

Updates are asynchronous (each worker applies its own step to the variables on the parameter
servers, in whatever order the workers finish), so no run can equal the one-device reference
step for step. A job here returns the trained weights, how many steps were really applied (a
plain ``tf.Variable``'s atomic ``assign_add`` counts the steps run; with a
``LossScaleOptimizer``, which may skip one, its loss scale says whether it did) and what the
optimizer's own ``iterations`` counted. Keras 3 applies gradients with TensorFlow's atomic
``assign_sub``, but counts its iterations with ``KerasVariable.assign_add``, a read then an
assign, which loses counts when two workers step at once (lesson 04). ``verdicts.py`` asks
that every scheduled step was applied (or skipped by a loss scale) and that the loss fell, and
reports a short count.
"""

from __future__ import annotations

from typing import Any

from course_utils.works_where.cells import REMAT_ROWS
from course_utils.works_where.jobs import compiled_keras3, replica_training
from course_utils.works_where.task import Task

__all__ = ["PS_STEPS", "ps_custom_loop", "ps_loss_scaled_loop", "ps_trainer", "ps_fit_tf_keras",
           "ps_fit_keras3", "ps_fit_with_accumulation", "PS_JOBS"]

#: Steps each parameter-server job schedules (several passes over the task's batches).
PS_STEPS = 24


def _scheduled_loop(strategy: Any, task: Task, policy: str | None = None,
                    recompute: bool = False) -> tuple[Any, Any, int]:
    """``coordinator.schedule`` of a ``strategy.run`` step ``PS_STEPS`` times: the model, the
    optimizer and how many steps ran to the end (a plain variable on the ps counts them)."""
    import tensorflow as tf

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    model, optimizer, train_replica = replica_training(strategy, task, policy, recompute)
    with strategy.scope():
        run = tf.Variable(0, dtype=tf.int64)  # a plain variable: atomic assign_add

    def replica_step(x: Any, y: Any) -> None:
        train_replica(x, y)
        run.assign_add(1)

    @tf.function
    def worker_step(iterator: Any) -> None:
        strategy.run(replica_step, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(lambda: task.dataset().repeat()))
    for _ in range(PS_STEPS):
        coordinator.schedule(worker_step, args=(iterator,))
    coordinator.join()
    return model, optimizer, int(run.numpy())


def ps_custom_loop(strategy: Any, task: Task, recompute: bool = False) -> tuple[list, int, int]:
    """The scheduled custom loop with plain SGD, which applies every step it runs: the steps
    run are the steps applied."""
    model, optimizer, run = _scheduled_loop(strategy, task, recompute=recompute)
    return model.get_weights(), run, int(optimizer.iterations.numpy())


def ps_loss_scaled_loop(strategy: Any, task: Task) -> tuple[list, int, int, int]:
    """The scheduled loop under ``mixed_float16`` with a ``LossScaleOptimizer``: the weights,
    the steps applied, ``optimizer.iterations`` and the steps skipped.

    A step whose gradients are not finite runs but is skipped (the optimizer only halves its
    scale), as loss scaling must: ``verdicts.check_async`` counts it as accounted for, not as
    lost. Within ``PS_STEPS`` (fewer than ``dynamic_growth_steps``) nothing else changes the
    scale: a scale still at ``initial_scale`` means no step was skipped. Otherwise each halving
    that landed is a skip (two at once may land as one, a read then a write): the skips
    returned are then at most those made, and the steps applied (run less skipped) at least.
    """
    import math

    model, optimizer, run = _scheduled_loop(strategy, task, policy="mixed_float16")
    assert PS_STEPS < optimizer.dynamic_growth_steps, "the scale could grow: count differently"
    scale = float(optimizer.dynamic_scale.numpy())
    skipped = round(math.log2(optimizer.initial_scale / scale))
    return model.get_weights(), run - skipped, int(optimizer.iterations.numpy()), skipped


def ps_trainer(strategy: Any, task: Task) -> tuple[list, int, int]:
    """``cu.Trainer`` under the parameter-server strategy (it schedules the steps itself)."""
    import keras

    from course_utils.training import Trainer

    trainer = Trainer(task.keras_model, lambda: keras.optimizers.SGD(task.learning_rate),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None),
                      strategy=strategy, verbose=0)
    trainer.fit(lambda context: task.dataset().repeat(), steps_per_epoch=PS_STEPS)
    return (trainer.model.get_weights(), trainer.steps,
            int(trainer.optimizer.iterations.numpy()))


def ps_fit_tf_keras(strategy: Any, task: Task) -> tuple[list, int, int]:
    """tf_keras ``fit`` with a ``DatasetCreator`` and a legacy optimizer, as tf_keras asks."""
    import tf_keras

    with strategy.scope():
        model = task.tf_keras_model()
        model.compile(tf_keras.optimizers.legacy.SGD(task.learning_rate),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    creator = tf_keras.utils.experimental.DatasetCreator(lambda context: task.dataset().repeat())
    model.fit(creator, epochs=1, steps_per_epoch=PS_STEPS, verbose=0)
    iterations = int(model.optimizer.iterations.numpy())
    return model.get_weights(), iterations, iterations


def ps_fit_keras3(strategy: Any, task: Task, accumulation_steps: int | None = None,
                  remat: str | None = None, **compile_options: Any) -> tuple[list, int, int]:
    """Keras 3 ``fit`` under the parameter-server strategy (``compile_options`` to compile)."""
    model = compiled_keras3(strategy, task, accumulation_steps, remat, **compile_options)
    batch = task.global_batch // (accumulation_steps or 1)
    model.fit(task.dataset(batch).repeat(), epochs=1, steps_per_epoch=PS_STEPS, verbose=0,
              shuffle=False)
    iterations = int(model.optimizer.iterations.numpy())
    return model.get_weights(), iterations, iterations


def ps_fit_with_accumulation(strategy: Any, task: Task) -> tuple[list, int, int]:
    """Keras 3 ``fit`` with ``gradient_accumulation_steps=2`` under parameter servers."""
    return ps_fit_keras3(strategy, task, accumulation_steps=2)


#: Row -> the job that trains it under ParameterServerStrategy.
PS_JOBS = {
    "keras3_fit": ps_fit_keras3,
    "steps_per_execution": lambda strategy, task: ps_fit_keras3(strategy, task,
                                                                steps_per_execution=2),
    "jit_compile": lambda strategy, task: ps_fit_keras3(strategy, task, jit_compile=True),
    "custom_loop": ps_custom_loop,
    "trainer": ps_trainer,
    "tf_keras_fit": ps_fit_tf_keras,
    "gradient_accumulation": ps_fit_with_accumulation,
    "loss_scale_optimizer": ps_loss_scaled_loop,
    "recompute_grad": lambda strategy, task: ps_custom_loop(strategy, task, recompute=True),
    **{row: (lambda strategy, task, row=row: ps_fit_keras3(strategy, task, remat=row))
       for row in REMAT_ROWS},
}
