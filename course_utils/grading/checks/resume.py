"""Lesson 02's exercise 1: a run's latest checkpoint resumed under another strategy.

``check_resume_latest`` trains a small model with Adam, saving checkpoints with
``tf.train.CheckpointManager`` (one run also rolled back to an earlier checkpoint and saved
again), copies the folder file by file as it would reach another machine, and hands the
learner's ``resume_latest`` the copy; lesson 02's module re-exports it.
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


def _trainer(context: Any, model: Any, optimizer: Any) -> Any:
    """A ``tf.function`` step of Adam on the mean loss of a distributed global batch."""
    tf = _tf()
    per_example = per_example_loss()
    global_batch = 8 * context.num_replicas_in_sync

    def replica_step(xb: Any, yb: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    return tf.function(lambda batch: context.run(replica_step, args=batch))


def _batches(context: Any, x: Any, y: Any, steps: int) -> Any:
    """``steps`` distributed global batches of 8 examples per replica from ``(x, y)``."""
    tf = _tf()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        8 * context.num_replicas_in_sync, drop_remainder=True)
    return context.experimental_distribute_dataset(dataset.repeat().take(steps))


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The step count, weights and optimizer variables of a model and its Adam, copied."""
    import numpy as np

    return {"step": int(optimizer.iterations.numpy()), "weights": model.get_weights(),
            "optimizer state": [np.asarray(v) for v in optimizer.variables]}


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

    tf = _tf()
    model, x, y, features, classes = small_model(context, rng, "check_saved")
    with context.scope():
        optimizer = keras.optimizers.Adam(learning_rate=0.01)
        optimizer.build(model.trainable_variables)
    step = _trainer(context, model, optimizer)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=optimizer), directory, max_to_keep=None)
    states = []

    def save(done: int) -> None:
        if done in saved_after:
            manager.save()
            states.append(_state(model, optimizer))

    save(0)
    for done, batch in enumerate(_batches(context, x, y, steps), start=1):
        step(batch)
        save(done)
    return states, features, classes


def _rolled_back_run(context: Any, directory: str, back_to: int, steps: int, seed: int,
                     features: int, classes: int) -> tuple[int, dict[str, Any]]:
    """Restart the run of ``directory`` from ``ckpt-{back_to}``, as after a loss spike: a fresh
    model and Adam restored from it, ``steps`` steps on other batches, then one save by a new
    ``CheckpointManager`` over the same folder. The save counter came back with the checkpoint,
    so the save is numbered ``back_to + 1`` and overwrites that file; the abandoned steps'
    checkpoints with higher numbers stay. Returns the new checkpoint's number and state."""
    import os

    import keras

    from course_utils.data import teacher_classification
    from course_utils.models import mlp

    tf = _tf()
    with context.scope():
        model = mlp(features, classes, hidden_units=(8,), name="check_rolled_back")
        optimizer = keras.optimizers.Adam(learning_rate=0.01)
        optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint.restore(os.path.join(directory, f"ckpt-{back_to}")
                       ).assert_existing_objects_matched()
    x, y = teacher_classification(8 * context.num_replicas_in_sync * steps, features, classes,
                                  seed=seed)
    step = _trainer(context, model, optimizer)
    for batch in _batches(context, x, y, steps):
        step(batch)
    saved = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=None).save()
    return int(saved.rsplit("-", 1)[-1]), _state(model, optimizer)


def _states_on_disk(directory: str, features: int, classes: int
                    ) -> tuple[dict[int, dict[str, Any]], int]:
    """Each checkpoint file of ``directory`` read back (its number: its state), and the number
    of the latest one as TensorFlow records it: read after the learner's function returned, so
    that no frame or object of the check holds a state while it runs."""
    import os
    import re

    import keras

    from course_utils.models import mlp

    tf = _tf()
    on_disk = {}
    for name in os.listdir(directory):
        found = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if found:
            model = mlp(features, classes, hidden_units=(8,), name="check_read_back")
            optimizer = keras.optimizers.Adam(learning_rate=0.01)
            optimizer.build(model.trainable_variables)
            tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
                os.path.join(directory, name[:-len(".index")])).assert_existing_objects_matched()
            on_disk[int(found.group(1))] = _state(model, optimizer)
    return on_disk, _latest_number(directory)


def _latest_number(directory: str) -> int:
    """The number of the latest checkpoint as the folder's ``checkpoint`` record names it."""
    return int(_tf().train.latest_checkpoint(directory).rsplit("-", 1)[-1])


def _digest(directory: str) -> dict[str, str]:
    """Each file's name and the SHA-256 of its bytes: tells a folder changed."""
    import hashlib
    import os

    digest = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as handle:
            digest[name] = hashlib.sha256(handle.read()).hexdigest()
    return digest


def _copied_by_name(source: str, target: str) -> None:
    """Copy ``source``'s files into ``target`` one by one in name order, as a folder reaches
    another machine: each file's times are those of its copy (each later than the one before
    it in name order), not those of its save."""
    import os
    import shutil
    import time

    last = 0
    for name in sorted(os.listdir(source)):
        path = os.path.join(target, name)
        give_up = time.monotonic() + 0.05  # a file system whose clock moves slower: ties
        while True:  # until the file system's clock has moved past the previous file's
            shutil.copyfile(os.path.join(source, name), path)
            stamp = os.stat(path).st_mtime_ns
            if stamp > last or time.monotonic() > give_up:
                break
            time.sleep(0.001)
        last = stamp


@register
def check_resume_latest(fn: Any) -> bool:
    """Check ``resume_latest(directory, build_fresh)``: the latest checkpoint, restored.

    A run saved checkpoints with ``tf.train.CheckpointManager`` and stopped; the latest one
    must come back into the fresh pair ``build_fresh()`` returns, built under the other
    strategy: weights, Adam's moments and step count equal to the latest save's, and that
    step count returned. Trained under the strategy (a checkpoint before the first step and
    after every step: ``ckpt-9`` sorts after ``ckpt-12`` as text) and resumed on one device,
    then the other way round (a checkpoint every second step and the last), with step counts
    drawn afresh: a checkpoint's number is never the steps it holds, so the steps come from the
    restored state, not from a file name or a count of files. The second run is also rolled
    back to an earlier checkpoint and saved again, so the highest number is not the latest;
    and each folder is handed over as a copy made file by file in name order, so the newest
    file is not the latest either (the run's own folder, where it would be, is deleted before
    the learner's function runs). Only the record TensorFlow keeps (the folder's
    ``checkpoint`` file) says which is.
    """
    import shutil
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

    def run(trained_under_strategy: bool, steps: int, saved_after: set[int],
            rollback: tuple[int, int, int] | None) -> Any:
        one_device = tf.distribute.get_strategy()
        trained_in = strategy if trained_under_strategy else one_device
        resumed_in = one_device if trained_under_strategy else strategy
        fresh: list[Any] = []
        with (tempfile.TemporaryDirectory(prefix="check_02_", ignore_cleanup_errors=True)
              as saved, tempfile.TemporaryDirectory(prefix="check_02_copy_") as directory,
              tempfile.TemporaryDirectory() as kept):
            # the states stay in the files only while the learner's function runs: read back
            # after it returned (no frame of the check holds one it could copy), from a second
            # copy made as the learner's is, which tells no more than it
            _, features, classes = _checkpointed_run(trained_in, rng, steps, saved, saved_after)
            if rollback is not None:
                back_to, more_steps, seed = rollback
                _rolled_back_run(trained_in, saved, back_to, more_steps, seed, features,
                                 classes)  # ckpt-(back_to + 1), saved again
            _copied_by_name(saved, directory)
            _copied_by_name(saved, kept)
            # the run's own folder, whose newest file is the latest, is gone before the call (a
            # fresh read's answer found it in the temporary folder and passed, 1 of 1)
            shutil.rmtree(saved)

            def build_fresh() -> tuple[Any, Any]:
                with resumed_in.scope():
                    model = mlp(features, classes, hidden_units=(8,), name="check_restored")
                    optimizer = keras.optimizers.Adam(learning_rate=0.01)
                    optimizer.build(model.trainable_variables)
                fresh[:] = [model, optimizer]
                return model, optimizer

            # which is the latest, and the copy's bytes, taken before the call: an answer that
            # rewrote the check's copy (its 'checkpoint' record, in every folder under /tmp
            # that held the same one) passed, 1 of 1
            latest, before = _latest_number(kept), _digest(kept)
            returned = fn(directory, build_fresh)
            changed = _digest(kept) != before
            on_disk, _ = _states_on_disk(kept, features, classes)
        return returned, fresh, on_disk, latest, changed

    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    def verify(result: Any) -> str | None:
        returned, fresh, on_disk, latest, changed = result
        if changed:
            return ("a checkpoint folder other than the one you were given changed while your "
                    "function ran: read only `directory`, write nothing outside it")
        if not fresh:
            return "build_fresh() was never called: restore into the pair it returns"
        if not (isinstance(returned, (tuple, list)) and len(returned) == 3
                and returned[0] is fresh[0] and returned[1] is fresh[1]):
            return ("return (model, optimizer, steps_done): the pair build_fresh() gave you, "
                    "restored, and the number of steps already trained")
        restored = {"weights": fresh[0].get_weights(),
                    "optimizer state": [np.asarray(v) for v in fresh[1].variables]}
        want = on_disk[latest]
        if not same(restored["weights"], want["weights"]):
            found = [number for number, state in sorted(on_disk.items())
                     if same(restored["weights"], state["weights"])]
            which = (f"ckpt-{found[0]} (step {on_disk[found[0]]['step']})" if found
                     else "weights that no checkpoint holds")
            if found and found[0] > latest:
                which += (", saved on the steps the run abandoned when it was rolled back to "
                          "an earlier checkpoint")
            return (f"the restored model holds {which}; the latest checkpoint is "
                    f"ckpt-{latest} (step {want['step']}): "
                    "ask TensorFlow which is the latest (the directory's 'checkpoint' file "
                    "records it): neither the names' order, nor the highest number, nor the "
                    "files' times (the folder is a copy) say which")
        if not same(restored["optimizer state"], want["optimizer state"]):
            return ("the weights came back but the optimizer's state did not (Adam's step "
                    "count and moments): restore the model and the optimizer from the same "
                    "checkpoint, under the keys 'model' and 'optimizer'")
        done, last = returned[2], want["step"]
        if not isinstance(done, (int, np.integer)) or isinstance(done, bool) or done != last:
            named = (f" – the latest checkpoint's file name, ckpt-{latest}, and the count of "
                     "checkpoints are not the steps" if done in (latest, len(on_disk)) else "")
            return (f"steps_done is {done!r}; the latest checkpoint holds {last} steps{named}: "
                    "return it as an int, read from the restored state")
        return None

    replicas = strategy.num_replicas_in_sync
    long_run, short_run = rng.randint(10, 13), rng.randint(5, 7)
    every_other = {step for step in range(2, short_run, 2)} | {short_run}
    # rolled back to a checkpoint at least two below the last: a higher number stays behind
    rollback = (rng.randint(1, len(every_other) - 2), rng.randint(1, 2), rng.randint(0, 999))
    back_to, more_steps, _ = rollback
    copied = "the folder copied file by file in name order"
    cases = [Case(args=(True, long_run, set(range(long_run + 1)), None), verify=verify,
                  label=f"({long_run} steps on {replicas} replicas, a checkpoint before the "
                        f"first and after each: ckpt-1 to ckpt-{long_run + 1}; {copied}; "
                        "resumed on one device)"),
             Case(args=(False, short_run, every_other, rollback), verify=verify,
                  label=f"({short_run} steps on one device, a checkpoint after steps "
                        f"{sorted(every_other)}: ckpt-1 to ckpt-{len(every_other)}; then "
                        f"rolled back to ckpt-{back_to}, {more_steps} more "
                        f"step{'s' if more_steps > 1 else ''} and one save; {copied}; "
                        f"resumed on {replicas} replicas)")]
    return run_check("resume_latest", run, cases,
                     hint="which checkpoint does TensorFlow itself record as the latest, and "
                          "which restored object counts the steps the run trained? (lesson "
                          "02, section 4: the checkpoint).")
