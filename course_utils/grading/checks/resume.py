"""Lesson 02's exercise 1: a stopped run resumed under another strategy, where it left off.

``check_resume_training`` trains a small model with Adam on a stream of global batches, saving
checkpoints with ``tf.train.CheckpointManager`` (one run also rolled back to an earlier
checkpoint and trained on from there), copies the folder file by file as it would reach
another machine, and hands the learner's ``resume_training`` the copy, the examples and the
run's configuration. The learner's run must end where the uninterrupted run would have: the
latest checkpoint restored, the stream's batches it already trained on skipped, the run's
global batch kept on the new replicas. Lesson 02's module re-exports the check.
"""

from __future__ import annotations

import os
from typing import Any

from course_utils.grading.checks.clipped_step import Flows
from course_utils.grading.checks.folder_copies import copied_by_name, digest
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

__all__ = ["check_resume_training"]

LEARNING_RATE = 0.01  # Adam's, in the run and in build_fresh's pair


# --- Exercise 1 · resume a stopped run under another strategy, where it left off ---------------


def _trainer(context: Any, model: Any, optimizer: Any, global_batch: int) -> Any:
    """A ``tf.function`` step of Adam on the mean loss of a distributed global batch."""
    tf = _tf()
    per_example = per_example_loss()

    def replica_step(xb: Any, yb: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    return tf.function(lambda batch: context.run(replica_step, args=batch))


def stream(x: Any, y: Any, global_batch: int, start: int, steps: int) -> Any:
    """The run's stream of global batches, ``repeat().batch(global_batch)`` of ``(x, y)``:
    ``steps`` of them from the ``start``-th (step ``start + 1`` trains on batch ``start``)."""
    tf = _tf()
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch).skip(
        start).take(steps)


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The step count, weights and optimizer variables of a model and its Adam, copied."""
    import numpy as np

    return {"step": int(optimizer.iterations.numpy()), "weights": model.get_weights(),
            "optimizer state": [np.asarray(v) for v in optimizer.variables]}


def _adam_pair(context: Any, features: int, classes: int, name: str) -> tuple[Any, Any]:
    """A fresh model and a built Adam, in ``context``'s scope."""
    import keras

    from course_utils.models import mlp

    with context.scope():
        model = mlp(features, classes, hidden_units=(8,), name=name)
        optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def _checkpointed_run(context: Any, rng: Any, steps: int, directory: str, saved_after: set[int],
                      global_batch: int, size: int) -> tuple[Any, Any, int, int]:
    """Train a small model with Adam ``steps`` steps under ``context`` on the stream of
    ``global_batch`` examples, saving a checkpoint after each step in ``saved_after`` (0: before
    the first step).

    The checkpoints are written by ``tf.train.CheckpointManager`` into ``directory`` (keys
    ``model`` and ``optimizer``, every one kept), numbered 1, 2, … as they are saved: a
    checkpoint's number is not its step. Returns the first ``size`` examples (those trained
    on) and the model's sizes.
    """
    tf = _tf()
    import keras

    model, x, y, features, classes = small_model(context, rng, "check_saved")
    x, y = x[:size], y[:size]
    with context.scope():
        optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    step = _trainer(context, model, optimizer, global_batch)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=optimizer), directory, max_to_keep=None)
    if 0 in saved_after:
        manager.save()
    batches = context.experimental_distribute_dataset(stream(x, y, global_batch, 0, steps))
    for done, batch in enumerate(batches, start=1):
        step(batch)
        if done in saved_after:
            manager.save()
    return x, y, features, classes


def _rolled_back_run(context: Any, directory: str, back_to: int, steps: int, examples: Any,
                     global_batch: int, features: int, classes: int) -> None:
    """Restart the run of ``directory`` from ``ckpt-{back_to}``, as after a loss spike: a fresh
    model and Adam restored from it, ``steps`` steps on the stream from the restored step on,
    then one save by a new ``CheckpointManager`` over the same folder. The save counter came
    back with the checkpoint, so the save is numbered ``back_to + 1`` and overwrites that file;
    the abandoned steps' checkpoints with higher numbers stay."""
    tf = _tf()
    model, optimizer = _adam_pair(context, features, classes, "check_rolled_back")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint.restore(os.path.join(directory, f"ckpt-{back_to}")
                       ).assert_existing_objects_matched()
    step = _trainer(context, model, optimizer, global_batch)
    start = int(optimizer.iterations.numpy())
    for batch in context.experimental_distribute_dataset(
            stream(*examples, global_batch, start, steps)):
        step(batch)
    tf.train.CheckpointManager(checkpoint, directory, max_to_keep=None).save()


def _states_on_disk(directory: str, features: int, classes: int) -> dict[int, dict[str, Any]]:
    """Each checkpoint file of ``directory`` read back (its number: its state): read after the
    learner's function returned, so that no frame or object of the check holds a state while
    it runs."""
    import re

    tf = _tf()
    on_disk = {}
    for name in os.listdir(directory):
        found = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if found:
            model, optimizer = _adam_pair(tf.distribute.get_strategy(), features, classes,
                                          "check_read_back")
            tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
                os.path.join(directory, name[:-len(".index")])).assert_existing_objects_matched()
            on_disk[int(found.group(1))] = _state(model, optimizer)
    return on_disk


def continued(state: dict[str, Any], examples: Any, global_batch: int, start: int, steps: int,
              features: int, classes: int, optimizer_too: bool = True) -> list[Any]:
    """The weights after ``steps`` more steps on one device from a checkpoint's ``state``, on
    the stream of ``global_batch`` from its batch ``start`` (``optimizer_too``: Adam's state
    restored as well, else a fresh Adam)."""
    tf = _tf()
    model, optimizer = _adam_pair(tf.distribute.get_strategy(), features, classes,
                                  "check_continued")
    model.set_weights(state["weights"])
    if optimizer_too:
        for variable, value in zip(optimizer.variables, state["optimizer state"], strict=True):
            variable.assign(value)
    step = _trainer(tf.distribute.get_strategy(), model, optimizer, global_batch)
    for batch in stream(*examples, global_batch, start, steps):
        step(batch)
    return model.get_weights()


def _wrapping_size(rng: Any, done: int, global_batch: int, most: int = 256) -> int:
    """A number of examples (at most ``most``) whose end falls inside the stream's batch
    ``done``, the first the resumed run trains on: a stream batched before it repeats
    (``batch().repeat()``, with or without ``drop_remainder``), or skipped before it repeats,
    takes other batches there (r02 L1: every global batch divided 256, and no run wrapped)."""
    start, end = done * global_batch, (done + 1) * global_batch
    return rng.choice([n for n in range(global_batch + 1, most + 1)
                       if any(start < m * n < end for m in range(1, end // n + 1))])


def _latest_number(directory: str) -> int:
    """The number of the latest checkpoint as the folder's ``checkpoint`` record names it."""
    return int(_tf().train.latest_checkpoint(directory).rsplit("-", 1)[-1])


def _in_replica() -> bool:
    tf = _tf()
    return tf.distribute.in_cross_replica_context() is False and tf.distribute.has_strategy()


def _counting(tf: Any, context: Any, model: Any, anywhere: bool) -> Any:
    """Count the examples the model's first layer runs on (the check's own model: its layer's
    call wrapped): inside ``context``'s replicas, summed over them in an on-read variable, or
    ``anywhere`` (one device)."""
    with context.scope():
        fed = tf.Variable(0, dtype=tf.int64, trainable=False,
                          synchronization=tf.VariableSynchronization.ON_READ,
                          aggregation=tf.VariableAggregation.SUM)
    first = model.get_layer("dense_0")
    call = first.call

    def counting_call(*args: Any, **kwargs: Any) -> Any:
        if anywhere or (tf.distribute.has_strategy()
                        and not tf.distribute.in_cross_replica_context()):
            fed.assign_add(tf.cast(tf.shape(args[0])[0], tf.int64))
        return call(*args, **kwargs)

    first.call = counting_call
    return fed


@register
def check_resume_training(fn: Any) -> bool:
    """Check ``resume_training(directory, build_fresh, strategy, examples, config)``.

    A run trained with Adam on the stream ``repeat().batch(global_batch)`` of ``examples``
    (step ``k`` on its ``k``-th batch), saved checkpoints with ``tf.train.CheckpointManager``
    and stopped; ``config`` gives its replicas, per-replica batch and ``total_steps``. The
    learner restores the latest checkpoint into ``build_fresh()``'s pair, built in
    ``strategy``'s scope (another number of replicas), and trains on to ``total_steps`` under
    ``strategy``: the weights must be those of the run continued without a stop (made on one
    device, after the call, from the latest checkpoint read back), Adam's step count
    ``total_steps``, and under a mirrored strategy the replicas must have run the model on the
    remaining global batches' examples, each once. Trained under the strategy (a checkpoint
    before the first step and after every step: ``ckpt-9`` sorts after ``ckpt-12`` as text) and
    resumed on one device, then the other way round (a checkpoint every second step), with
    sizes drawn afresh. The second run is also rolled back to an earlier checkpoint and trained
    on from there, so the highest number is not the latest; each folder is handed over as a
    copy made file by file in name order, so the newest file is not the latest either. A wrong
    result is named by the runs it matches: the stream from its start, the new replicas' global
    batch, another checkpoint, a fresh Adam.
    """
    import shutil
    import tempfile

    import numpy as np

    from course_utils.training import checkpoints

    tf = _tf()
    strategy = mirrored_strategy()
    if raises_own_stub(fn, None, None, None, None, None):
        not_attempted("resume_training")
        return False
    # the course's Checkpoints (cu.training) restores the latest for you: refused by its code,
    # whatever name it was bound to before the check
    fn = refusing(fn, [checkpoints.__file__],
                  "restore with tf.train's own API, as lesson 02, section 4 does")
    rng = fresh_rng()

    def run(trained_under_strategy: bool, steps: int, saved_after: set[int], per_replica: int,
            more: int, rollback: tuple[int, int] | None, done: int) -> Any:
        one_device = tf.distribute.get_strategy()
        trained_in = strategy if trained_under_strategy else one_device
        resumed_in = one_device if trained_under_strategy else strategy
        config = {"num_replicas": trained_in.num_replicas_in_sync,
                  "per_replica_batch_size": per_replica}
        global_batch = per_replica * config["num_replicas"]
        fresh: list[Any] = []
        with (tempfile.TemporaryDirectory(prefix="check_02_", ignore_cleanup_errors=True)
              as saved, tempfile.TemporaryDirectory(prefix="check_02_copy_") as directory,
              tempfile.TemporaryDirectory() as kept):
            x, y, features, classes = _checkpointed_run(
                trained_in, rng, steps, saved, saved_after, global_batch,
                _wrapping_size(rng, done, global_batch))
            if rollback is not None:
                back_to, more_steps = rollback
                _rolled_back_run(trained_in, saved, back_to, more_steps, (x, y), global_batch,
                                 features, classes)  # ckpt-(back_to + 1), saved again
            copied_by_name(saved, directory)
            copied_by_name(saved, kept)
            # the run's own folder, whose newest file is the latest, is gone before the call (a
            # fresh read's answer found it in the temporary folder and passed, 1 of 1)
            shutil.rmtree(saved)
            latest, before = _latest_number(kept), digest(kept)
            config["total_steps"] = total = (
                int(tf.train.load_checkpoint(os.path.join(kept, f"ckpt-{latest}")).get_tensor(
                    "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) + more)
            counted: list[Any] = []

            def build_fresh() -> tuple[Any, Any]:
                model, optimizer = _adam_pair(resumed_in, features, classes,
                                              "check_restored")
                # in the replicas: the gradients handed to Adam there, against those that
                # flowed back through the model's calls there (r02 L2: a copy trained outside
                # them, the model called there for show, passed the count of examples)
                flows = (Flows(tf, resumed_in, model, optimizer, _in_replica)
                         if resumed_in is strategy else None)
                counted[:] = [_counting(tf, resumed_in, model, resumed_in is one_device),
                              flows]
                fresh[:] = [model, optimizer]
                return model, optimizer

            returned = fn(directory, build_fresh, resumed_in, (x.copy(), y.copy()),
                          dict(config))
            changed = digest(kept) != before
            on_disk = _states_on_disk(kept, features, classes)
        fed = int(counted[0].numpy()) if counted else 0
        flows = counted[1] if counted else None
        applied = (None if flows is None else
                   (flows.unexplained(), int(flows.calls.numpy()) // replicas))
        return (returned, fresh, fed, changed, on_disk, latest, total, global_batch,
                resumed_in.num_replicas_in_sync * per_replica, (x, y), features, classes,
                resumed_in is strategy, applied)

    def verify(result: Any) -> str | None:
        (returned, fresh, fed, changed, on_disk, latest, total, global_batch, theirs,
         examples, features, classes, resumed_in_replicas, applied) = result
        if changed:
            return ("a checkpoint folder other than the one you were given changed while your "
                    "function ran: read only `directory`, write nothing outside it")
        if not fresh:
            return "build_fresh() was never called: restore into the pair it returns"
        if not (isinstance(returned, (tuple, list)) and len(returned) == 2
                and returned[0] is fresh[0] and returned[1] is fresh[1]):
            return ("return (model, optimizer): the pair build_fresh() gave you, restored and "
                    "trained on")
        want = on_disk[latest]
        done, more = want["step"], total - want["step"]
        steps = int(fresh[1].iterations.numpy())
        if steps != total:
            if steps == more:
                return (f"Adam's step count is {steps} after your run, the steps you trained: "
                        f"the run had done {done} at its latest checkpoint (ckpt-{latest}), "
                        f"and must end at config['total_steps'] = {total}. Restore the "
                        "optimizer's state with the model's (Adam's step and moments)")
            return (f"Adam's step count is {steps} after your run; the run ends at "
                    f"config['total_steps'] = {total} steps in all, {done} of them done "
                    f"by its latest checkpoint (ckpt-{latest})")
        if fed != more * global_batch:
            if theirs != global_batch and fed == more * theirs:
                return (f"in your {more} steps the model ran on {fed} examples, global "
                        f"batches of {theirs} (the per-replica batch × this strategy's "
                        f"replicas); the run's global batches hold {global_batch} "
                        "(config's per_replica_batch_size × its num_replicas): keep the "
                        "run's global batch, whatever the replicas here (its learning rate "
                        "was set for it)")
            if fed % global_batch:
                return (f"the model ran on {fed} examples while your function ran, not a "
                        f"whole number of the run's global batches of {global_batch}: the "
                        "run's stream repeats the examples before it batches them "
                        "(repeat().batch()), so a global batch stays whole where it crosses "
                        f"the end of the {len(examples[0])} examples")
            steps_worth = fed // global_batch
            where = "" if not fed else next((
                f", as if from ckpt-{number} (step {state['step']})"
                + (", saved on the steps the run abandoned when it was rolled back"
                   if number > latest else "")
                for number, state in sorted(on_disk.items())
                if number != latest and state["step"] == total - steps_worth), "")
            inside = "in `strategy`'s replicas " if resumed_in_replicas else ""
            return (f"the model ran {inside}on {fed} examples while your function ran"
                    f"{where}; from the latest checkpoint, ckpt-{latest} (step {done}), the "
                    f"run has {more} steps left, {more * global_batch} examples in its global "
                    f"batches of {global_batch}: resume from the latest (ask TensorFlow "
                    "which it is: the directory's 'checkpoint' file records it; neither the "
                    "names' order, nor the highest number, nor the files' times – the "
                    "folder is a copy – say which), train those steps under `strategy`, and "
                    "call the model only there")
        weights = fresh[0].get_weights()

        def matches(other: list[Any]) -> bool:
            return all(np.allclose(a, b, rtol=1e-4, atol=1e-5)
                       for a, b in zip(weights, other, strict=True))

        sizes = (features, classes)
        if matches(continued(want, examples, global_batch, done, more, *sizes)):
            if applied is None:
                return None
            if applied[0] is None or applied[0] > 1e-3 or applied[1] != more:
                said = ("no gradient" if applied[0] is None else
                        f"gradients on {applied[1]} of the {more} steps left, "
                        f"{100 * applied[0]:.3g}% of them unexplained by the backward passes "
                        "through the model's calls there")
                return (f"the weights are right, but in `strategy`'s replicas Adam was handed "
                        f"{said}: train in the replicas, each step's update from the gradient "
                        "of its own examples (not a model trained elsewhere, then called "
                        "there for show)")
            return None
        end = f"the run continued without a stop, to step {total}"
        if matches(continued(want, examples, global_batch, 0, more, *sizes)):
            return (f"your weights are those of ckpt-{latest} trained on the stream's first "
                    f"{more} batches, not {end}: the run had trained on the first {done}; "
                    "skip them – step k takes the stream's k-th global batch")
        if matches(continued(want, examples, global_batch, done, more, *sizes,
                             optimizer_too=False)):
            return ("your weights are those of a fresh Adam from the latest weights: restore "
                    "the optimizer's state with the model's (Adam's moments)")
        far = max(float(np.max(np.abs(a - b))) for a, b in zip(
            weights, continued(want, examples, global_batch, done, more, *sizes),
            strict=True))
        return (f"your weights differ from those of {end} by up to {far:.3g} (on the "
                f"stream repeat().batch({global_batch}) from its batch {done}: its first "
                f"batch crosses the end of the {len(examples[0])} examples)")

    replicas = strategy.num_replicas_in_sync
    long_run, short_run = rng.randint(10, 13), rng.randint(5, 7)
    every_other = {step for step in range(2, short_run, 2)} | {short_run}
    # rolled back to a checkpoint at least two below the last: a higher number stays behind
    rollback = (rng.randint(1, len(every_other) - 2), rng.randint(1, 2))
    back_to, more_steps = rollback
    copied = "the folder copied file by file in name order"
    per_replica = [rng.choice([4, 8]), rng.choice([4, 8]) * replicas]
    more = [rng.randint(2, 3), rng.randint(2, 3)]
    # the steps done by the latest checkpoint: the last run's, or the rolled-back one's
    done = [long_run, sorted(every_other)[back_to - 1] + more_steps]
    cases = [Case(args=(True, long_run, set(range(long_run + 1)), per_replica[0], more[0],
                        None, done[0]), verify=verify,
                  label=f"({long_run} steps on {replicas} replicas × {per_replica[0]} "
                        "examples, a checkpoint before the first and after each: ckpt-1 to "
                        f"ckpt-{long_run + 1}; {copied}; resumed on one device for "
                        f"{more[0]} more steps)"),
             Case(args=(False, short_run, every_other, per_replica[1], more[1], rollback,
                        done[1]),
                  verify=verify,
                  label=f"({short_run} steps on one device × {per_replica[1]} examples, a "
                        f"checkpoint after steps {sorted(every_other)}: ckpt-1 to "
                        f"ckpt-{len(every_other)}; then rolled back to ckpt-{back_to}, "
                        f"{more_steps} more step{'s' if more_steps > 1 else ''} and one save; "
                        f"{copied}; resumed on {replicas} replicas for {more[1]} more steps)")]
    return run_check("resume_training", run, cases,
                     hint="which checkpoint does TensorFlow itself record as the latest, "
                          "which restored object counts the steps done, and which batches did "
                          "the run take after them, of what size? (lesson 02, section 4: the "
                          "checkpoint; section 2: the global batch)")
