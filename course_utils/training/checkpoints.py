"""Checkpoints and resume: a restarted job continues where the last one stopped.

A checkpoint holds the model, the optimizer and two counters: the run step (batches done in the
current run) and whether that run completed. A new job reads the newest checkpoint: if its run
did not complete, training resumes at its run step; if it did, a new run starts from step 0
(as Keras's ``BackupAndRestore`` does). With several workers every worker takes part in a save,
and only the chief keeps the files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from course_utils.quiet import import_tensorflow
from course_utils.training.parameter_server import is_parameter_server

tf = import_tensorflow()

__all__ = ["Checkpoints", "is_chief"]


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True for the task that writes checkpoints (the chief, worker 0, or a single process)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or is_parameter_server(strategy):
        return True
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in spec


class Checkpoints:
    """The checkpoints of one model and optimizer in ``directory`` (None: no checkpoints).

    Create it inside ``strategy.scope()``: its two counters are variables of the strategy.
    """

    def __init__(
        self,
        directory: str | None,
        model: Any,
        optimizer: Any,
        max_to_keep: int = 2,
        chief: bool = True,
    ) -> None:
        self.directory = directory
        self.max_to_keep = max_to_keep
        self.chief = chief
        counter = dict(trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.run_step = tf.Variable(0, dtype=tf.int64, name="run_step", **counter)
        self.completed = tf.Variable(0, dtype=tf.int64, name="completed", **counter)
        self._model = model
        self._optimizer = optimizer
        self._checkpoint: tf.train.Checkpoint | None = None
        self._manager: tf.train.CheckpointManager | None = None

    def _tracked(self) -> tf.train.Checkpoint:
        if self._checkpoint is None:
            self._checkpoint = tf.train.Checkpoint(
                model=self._model,
                optimizer=self._optimizer,
                run_step=self.run_step,
                completed=self.completed,
            )
            self._manager = tf.train.CheckpointManager(
                self._checkpoint, self.directory, max_to_keep=self.max_to_keep
            )
        return self._checkpoint

    def latest(self) -> str | None:
        """Path of the newest checkpoint in the directory (None when there is none)."""
        if self.directory is None:
            return None
        return tf.train.latest_checkpoint(self.directory)

    def save(self, run_step: int, completed: bool = False) -> str | None:
        """Write a checkpoint at ``run_step`` (every worker calls this; the chief keeps it)."""
        if self.directory is None:
            return None
        checkpoint = self._tracked()
        self.run_step.assign(run_step)
        self.completed.assign(int(completed))
        if self.chief:
            return self._manager.save(checkpoint_number=run_step)
        # Non-chief workers take part in the save but write to a directory they delete.
        scratch = tempfile.mkdtemp(prefix="worker_ckpt_")
        try:
            checkpoint.write(os.path.join(scratch, "ckpt"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def restore(self, path: str | None = None) -> int | None:
        """Restore from ``path`` (default: the newest); return its run step, None if no file."""
        path = path or self.latest()
        if path is None:
            return None
        self._tracked().restore(path).expect_partial()
        return int(self.run_step.numpy())

    def resume_step(self) -> int | None:
        """Restore the newest checkpoint of an unfinished run and return its step, else None."""
        latest = self.latest()
        if latest is None:
            return None
        completed = int(tf.train.load_variable(latest, "completed/.ATTRIBUTES/VARIABLE_VALUE"))
        if completed:
            return None  # the last run finished: start a new run (like keras BackupAndRestore)
        return self.restore(latest)
