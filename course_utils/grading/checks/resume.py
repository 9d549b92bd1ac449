"""Lesson 02's exercise 1: a run's latest checkpoint resumed under another strategy.

``check_resume_latest`` trains a small model with Adam, saving a checkpoint every step with
``tf.train.CheckpointManager``, and hands the learner's ``resume_latest`` the folder; lesson 02's
module re-exports it.
"""

from __future__ import annotations

from typing import Any

from course_utils.grading.checks.refusals import refusing
from course_utils.grading.checks.registry import register
from course_utils.grading.checks.replicas import (
    mirrored_strategy,
    per_example_loss,
    raises_own_stub,
    small_model,
)
from course_utils.grading.framework import Case, fresh_rng, not_attempted, run_check
from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["check_resume_latest"]


# --- Exercise 1 · resume from the latest checkpoint, under another strategy --------------------


def _checkpointed_run(context: Any, rng: Any, steps: int, directory: str, saved_after: set[int]
                      ) -> tuple[list[dict[str, Any]], int, int]:
    """Train a small model with Adam ``steps`` steps under ``context``, saving a checkpoint
    after each step in ``saved_after`` (0: before the first step).

    The checkpoints are written by ``tf.train.CheckpointManager`` into ``directory`` (keys
    ``model`` and ``optimizer``, every one kept), numbered 1, 2, … as they are saved: a
    checkpoint's number is not its step. Returns each checkpoint's state (its step, weights,
    optimizer variables), and the model's sizes.
    """
    import keras
    import numpy as np

    tf = _tf()
    model, x, y, features, classes = small_model(context, rng, "check_saved")
    with context.scope():
        optimizer = keras.optimizers.Adam(learning_rate=0.01)
        optimizer.build(model.trainable_variables)
    per_example = per_example_loss()
    global_batch = 8 * context.num_replicas_in_sync

    def replica_step(xb: Any, yb: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    step = tf.function(lambda batch: context.run(replica_step, args=batch))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=optimizer), directory, max_to_keep=None)
    states = []

    def save(done: int) -> None:
        if done in saved_after:
            manager.save()
            states.append({"step": done, "weights": model.get_weights(),
                           "optimizer state": [np.asarray(v) for v in optimizer.variables]})

    save(0)
    batches = context.experimental_distribute_dataset(dataset.repeat().take(steps))
    for done, batch in enumerate(batches, start=1):
        step(batch)
        save(done)
    return states, features, classes


@register
def check_resume_latest(fn: Any) -> bool:
    """Check ``resume_latest(directory, build_fresh)``: the latest checkpoint, restored.

    A run saved checkpoints with ``tf.train.CheckpointManager`` and stopped; the latest one
    (``ckpt-12``, not ``ckpt-9``, which sorts last as text) must come back into the fresh pair
    ``build_fresh()`` returns, built under the other strategy: weights, Adam's moments and
    step count equal to the last step's, and the number of steps done returned. Trained under
    the strategy (a checkpoint before the first step and after every step) and resumed on one
    device, then the other way round (a checkpoint every second step and the last), with step
    counts drawn afresh: a checkpoint's number is never the steps it holds, so the steps come
    from the restored state, not from a file name or a count of files.
    """
    import tempfile

    import keras
    import numpy as np

    from course_utils.models import mlp
    from course_utils.training import checkpoints

    tf = _tf()
    strategy = mirrored_strategy()
    if raises_own_stub(fn, None, None):
        not_attempted("resume_latest")
        return False
    # the course's Checkpoints (cu.training) restores the latest for you: refused by its code,
    # whatever name it was bound to before the check
    fn = refusing(fn, [checkpoints.__file__],
                  "restore with tf.train's own API, as lesson 02, section 4 does")
    rng = fresh_rng()

    def run(trained_under_strategy: bool, steps: int, saved_after: set[int]) -> Any:
        one_device = tf.distribute.get_strategy()
        trained_in = strategy if trained_under_strategy else one_device
        resumed_in = one_device if trained_under_strategy else strategy
        fresh: list[Any] = []
        with tempfile.TemporaryDirectory(prefix="check_02_") as directory:
            states, features, classes = _checkpointed_run(trained_in, rng, steps, directory,
                                                          saved_after)

            def build_fresh() -> tuple[Any, Any]:
                with resumed_in.scope():
                    model = mlp(features, classes, hidden_units=(8,), name="check_restored")
                    optimizer = keras.optimizers.Adam(learning_rate=0.01)
                    optimizer.build(model.trainable_variables)
                fresh[:] = [model, optimizer]
                return model, optimizer

            returned = fn(directory, build_fresh)
        return returned, fresh, states

    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    def verify(result: Any) -> str | None:
        returned, fresh, states = result
        if not fresh:
            return "build_fresh() was never called: restore into the pair it returns"
        if not (isinstance(returned, (tuple, list)) and len(returned) == 3
                and returned[0] is fresh[0] and returned[1] is fresh[1]):
            return ("return (model, optimizer, steps_done): the pair build_fresh() gave you, "
                    "restored, and the number of steps already trained")
        restored = {"weights": fresh[0].get_weights(),
                    "optimizer state": [np.asarray(v) for v in fresh[1].variables]}
        last = states[-1]["step"]
        if not same(restored["weights"], states[-1]["weights"]):
            found = [number for number, state in enumerate(states, start=1)
                     if same(restored["weights"], state["weights"])]
            which = (f"ckpt-{found[0]} (step {states[found[0] - 1]['step']})" if found
                     else "weights that no checkpoint holds")
            return (f"the restored model holds {which}; the latest checkpoint is "
                    f"ckpt-{len(states)} (step {last}): "
                    "ask TensorFlow which is the latest (the directory's 'checkpoint' file "
                    "records it), do not sort file names")
        if not same(restored["optimizer state"], states[-1]["optimizer state"]):
            return ("the weights came back but the optimizer's state did not (Adam's step "
                    "count and moments): restore the model and the optimizer from the same "
                    "checkpoint, under the keys 'model' and 'optimizer'")
        done = returned[2]
        if not isinstance(done, (int, np.integer)) or isinstance(done, bool) or done != last:
            named = (f" – the latest checkpoint's file name, ckpt-{len(states)}, and the "
                     "count of checkpoints are not the steps" if done == len(states) else "")
            return (f"steps_done is {done!r}; the run had trained {last} steps{named}: return "
                    "it as an int, read from the restored state")
        return None

    replicas = strategy.num_replicas_in_sync
    long_run, short_run = rng.randint(10, 13), rng.randint(3, 6)
    every_other = {step for step in range(2, short_run, 2)} | {short_run}
    cases = [Case(args=(True, long_run, set(range(long_run + 1))), verify=verify,
                  label=f"({long_run} steps on {replicas} replicas, a checkpoint before the "
                        f"first and after each: ckpt-1 to ckpt-{long_run + 1}; resumed on one "
                        "device)"),
             Case(args=(False, short_run, every_other), verify=verify,
                  label=f"({short_run} steps on one device, a checkpoint after steps "
                        f"{sorted(every_other)}: ckpt-1 to ckpt-{len(every_other)}; resumed "
                        f"on {replicas} replicas)")]
    return run_check("resume_latest", run, cases,
                     hint="which checkpoint does TensorFlow itself record as the latest, and "
                          "which restored object counts the steps the run trained? (lesson "
                          "02, section 4: the checkpoint).")
