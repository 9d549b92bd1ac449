"""The Trainer: builds the model and optimizer in the strategy's scope and runs the epochs.

It orchestrates the other modules: the replica step (``replica_step.py``) inside a
``tf.function`` per group of micro-batches (``accumulation.py``), or scheduled on workers
(``parameter_server.py``); the precision policy (``precision.py``); checkpoints and resume
(``checkpoints.py``); the reported loss and metrics (``metrics.py``) and the progress bar
(``progress.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.quiet import import_tensorflow
from course_utils.training.accumulation import split_into_calls
from course_utils.training.batches import (
    DataLike,
    count_steps,
    distribute,
    element_spec,
    skip_read_batches,
    unpack_batch,
)
from course_utils.training.checkpoints import Checkpoints, is_chief
from course_utils.training.evaluation import make_eval_function
from course_utils.training.metrics import LossTotals, copy_metric, epoch_logs, reset_metrics
from course_utils.training.parameter_server import (
    CoordinatorLoop,
    UnsupportedByKeras3Error,
    is_parameter_server,
    refuse_variable_partitioner,
)
from course_utils.training.precision import check_policy, policy_scope, with_loss_scaling
from course_utils.training.progress import check_verbose, progress_bar, report_epoch
from course_utils.training.replica_step import LossFn, make_replica_step, make_train_function

tf = import_tensorflow()

import keras  # noqa: E402  (after TensorFlow, which must be imported quietly first)

__all__ = ["Trainer"]


class Trainer:
    """Train a Keras 3 model with a custom loop under any ``tf.distribute`` strategy.

    Args:
        model_fn: ``() -> keras.Model``, called inside ``strategy.scope()`` and the policy.
        optimizer_fn: ``() -> keras optimizer``, called inside ``strategy.scope()``.
        loss_fn: ``(y_true, y_pred) -> per-example losses`` of shape ``[batch]`` (a Keras loss
            built with ``reduction=None`` works). Extra axes are averaged.
        strategy: any ``tf.distribute.Strategy``; ``None`` means the current (default) strategy.
        accumulation_steps: one optimizer update per ``k`` batches.
        mixed_precision: ``None``/``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.
        metrics: Keras metrics (objects or names; ``"accuracy"`` picks binary, sparse or
            categorical accuracy from the shapes), reported per epoch in the history.
        checkpoint_dir: when set, a checkpoint is written at each epoch end (and every
            ``checkpoint_every_steps`` batches), and a restarted run resumes from the last one.
            With several workers the chief writes it and every worker reads it back, so it must
            be visible to all of them (one machine, a shared file system or a bucket).
        steps_per_execution: optimizer updates per ``tf.function`` call.
        checkpoint_every_steps: also save every this many batches (rounded to whole executions).
        max_checkpoints: how many checkpoints to keep.
        verbose: ``"auto"`` (a bar in a notebook only), 0, 1 (a bar) or 2 (a line per epoch).

    With ``accumulation_steps=k`` an epoch of ``n`` batches makes ``n // k`` updates; a last group
    of fewer than ``k`` batches makes one more update from the examples it has. A step is one
    batch, as in Keras: ``trainer.steps`` counts batches, ``trainer.updates`` optimizer updates.
    """

    def __init__(
        self,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        loss_fn: LossFn,
        strategy: tf.distribute.Strategy | None = None,
        accumulation_steps: int = 1,
        mixed_precision: str | None = None,
        metrics: Sequence[Any] = (),
        checkpoint_dir: str | os.PathLike | None = None,
        *,
        steps_per_execution: int = 1,
        checkpoint_every_steps: int | None = None,
        max_checkpoints: int = 2,
        verbose: int | str = "auto",
    ) -> None:
        self.mixed_precision = check_policy(mixed_precision)
        self.accumulation_steps = _at_least_one("accumulation_steps", accumulation_steps)
        self.steps_per_execution = _at_least_one("steps_per_execution", steps_per_execution)
        self.verbose = check_verbose(verbose)
        self.strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        self.loss_fn = loss_fn
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_every_steps = checkpoint_every_steps
        self.max_checkpoints = max_checkpoints
        self.is_parameter_server = is_parameter_server(self.strategy)
        self.is_chief = is_chief(self.strategy)
        #: Batches trained by this Trainer (counted on the host, exact under parameter servers).
        self.steps = 0
        #: Optimizer updates applied (steps / accumulation_steps, counted on the host).
        self.updates = 0
        #: Batches done in the current run (what a checkpoint stores to resume).
        self.run_step = 0
        #: The run step a checkpoint was restored from, or None.
        self.resumed_from_step: int | None = None
        self._train_functions: dict[int, Any] = {}
        self._eval_function: Any = None
        self._restore_checked = False
        self._last_run_completed = False
        self._built = False
        refuse_variable_partitioner(self.strategy)

        with policy_scope(self.mixed_precision), self.strategy.scope():
            self.model = model_fn()
            if not isinstance(self.model, keras.Model):
                raise ValueError(f"model_fn must return a keras.Model, got {self.model!r}")
            self.optimizer = with_loss_scaling(optimizer_fn(), self.mixed_precision)
            _check_created_in_scope(self.strategy, self.model.variables, "model_fn")
            _check_created_in_scope(self.strategy, self.optimizer.variables, "optimizer_fn")
            if self.is_parameter_server:
                self._totals = None
            else:
                self._totals = LossTotals()
                self.metrics = [copy_metric(m) for m in metrics]
            self._checkpoints = Checkpoints(
                self.checkpoint_dir, self.model, self.optimizer, max_checkpoints, self.is_chief
            )
        if self.is_parameter_server:
            # Metrics live on the coordinator, fed with values the workers return.
            self.metrics = [copy_metric(m) for m in metrics]
        self._replica_step = make_replica_step(
            self.model,
            self.optimizer,
            self.loss_fn,
            self.metrics,
            self._totals,
            self.strategy.num_replicas_in_sync,
            on_parameter_servers=self.is_parameter_server,
        )
        self._coordinator_loop = (
            CoordinatorLoop(self.strategy, self._replica_step) if self.is_parameter_server else None
        )
        if self.model.built:
            self._build(None)

    # ------------------------------------------------------------------ building
    def _build(self, spec: Any) -> None:
        """Build the model and the optimizer inside the scope before the first step."""
        if self._built:
            return
        with self.strategy.scope():
            if not self.model.built:
                if spec is None:
                    raise ValueError("the model is not built; pass data so its shape is known")
                x_spec = unpack_batch(spec)[0]
                shapes = tf.nest.map_structure(lambda s: s.shape, x_spec)
                with policy_scope(self.mixed_precision):
                    self.model.build(shapes)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)
        _check_created_in_scope(self.strategy, self.model.variables, "model_fn")
        self._built = True

    # ------------------------------------------------------------------ checkpoints
    def latest_checkpoint(self) -> str | None:
        """Path of the newest checkpoint in ``checkpoint_dir`` (None when there is none)."""
        return self._checkpoints.latest()

    def save_checkpoint(self, completed: bool = False) -> str | None:
        """Write a checkpoint (every worker must call this; only the chief keeps its files)."""
        return self._checkpoints.save(self.run_step, completed)

    def restore(self, path: str | None = None) -> bool:
        """Restore the model, optimizer and run counter from a checkpoint; True if one was read."""
        run_step = self._checkpoints.restore(path)
        if run_step is None:
            return False
        self.run_step = run_step
        return True

    def _maybe_resume(self) -> None:
        """Once per Trainer: resume an unfinished run from the newest checkpoint."""
        if self._restore_checked or self.checkpoint_dir is None:
            return
        self._restore_checked = True
        run_step = self._checkpoints.resume_step()
        if run_step is not None:
            self.run_step = self.resumed_from_step = run_step

    # ------------------------------------------------------------------ fit
    def fit(
        self,
        data: DataLike,
        epochs: int = 1,
        steps_per_epoch: int | None = None,
        on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    ) -> dict[str, list[float]]:
        """Train for ``epochs`` epochs and return the history (``history["loss"]`` per epoch).

        ``data`` is a ``tf.data.Dataset`` of global batches ``(x, y)`` or a function of a
        ``tf.distribute.InputContext`` returning a dataset of per-replica batches. An epoch is
        ``steps_per_epoch`` batches (default: the dataset's length). With ``checkpoint_dir`` a
        run interrupted earlier resumes at the step it last saved. ``on_epoch_end(epoch, logs)``
        is called after each epoch's checkpoint. A resumed run reads and discards the
        distributed batches the interrupted run had read (``skip_read_batches``), whatever the
        sharding, so it reads what an uninterrupted run would have read next when the data is
        made anew (as a restarted process makes it, not reused in one process) with
        ``deterministic`` left True, as far as its random draws replay: repeating data (with
        ``steps_per_epoch``) is one iterator, and the skip reads through every draw, those of a
        sequential ``map`` included (a parallel ``map`` hands draws out as its threads run).
        Finite data resumed in a later epoch makes and drops, unread, one iterator per earlier
        epoch: it replays what is drawn when an iterator is made (a whole-dataset ``shuffle``,
        ``cache().shuffle()``) or alike every epoch (a seeded op in a ``map``, a seeded
        ``shuffle`` made inside an ``interleave`` function), not what is drawn or stored while
        batches are read (``shuffle().repeat(n)``, ``shuffle().cache()``, a shuffled dataset an
        ``interleave`` function captures, a Keras random layer or ``tf.random.Generator`` in a
        ``map``): repeat those. Not under parameter servers: each worker's iterator restarts.
        """
        if int(epochs) != epochs or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        self._build(element_spec(data))
        steps = count_steps(data, steps_per_epoch, self.is_parameter_server)
        self._maybe_resume()
        if self.resumed_from_step is None or self._last_run_completed:
            self.run_step = 0
        start_epoch, done_in_epoch = divmod(self.run_step, steps)
        history: dict[str, list[float]] = {"loss": []}
        for metric in self.metrics:
            history[metric.name] = []
        iterator = None
        for epoch in range(start_epoch, epochs):
            iterator = self._epoch_iterator(data, iterator, steps_per_epoch, done_in_epoch,
                                            epoch)
            logs = self._run_epoch(iterator, steps - done_in_epoch, epoch, epochs)
            done_in_epoch = 0
            for key, value in logs.items():
                history.setdefault(key, []).append(value)
            self.save_checkpoint(completed=epoch == epochs - 1)
            if on_epoch_end is not None:
                on_epoch_end(epoch, logs)
        self._last_run_completed = True
        return history

    def _epoch_iterator(
        self, data: DataLike, iterator: Any, steps_per_epoch: int | None, done_in_epoch: int,
        epoch: int,
    ) -> Any:
        """The iterator for the next epoch: the same one when the data repeats, else a new one."""
        repeating = self._coordinator_loop is not None or steps_per_epoch is not None
        if repeating and iterator is not None:
            return iterator  # keep reading where the last epoch stopped
        if self._coordinator_loop is not None:
            return self._coordinator_loop.per_worker_iterator(data)  # not skipped on resume
        # Resumed: skip what the interrupted run read. Repeating data is one iterator for the
        # whole run (run_step batches read); otherwise each epoch starts the data again, from
        # an iterator made as the interrupted run made one per epoch before it: a shuffle
        # reshuffled each epoch draws its order when an iterator is made.
        if not repeating and iterator is None:
            for _ in range(epoch):
                iter(distribute(self.strategy, data))
        read = self.run_step if repeating else done_in_epoch
        return skip_read_batches(iter(distribute(self.strategy, data)), read)

    def _run_epoch(self, iterator: Any, todo: int, epoch: int, epochs: int) -> dict[str, float]:
        """Train ``todo`` batches from ``iterator``, show progress and return the epoch's logs."""
        reset_metrics(self.metrics)
        bar = progress_bar(self.verbose, todo, epoch, epochs)

        def after_call(batches: int, updates: int) -> None:
            self._count(batches, updates)
            if bar is not None:
                bar.update(batches)

        calls = split_into_calls(todo, self.accumulation_steps, self.steps_per_execution)
        if self._coordinator_loop is not None:
            mean_loss = self._coordinator_loop.run_epoch(iterator, calls, self.metrics, after_call)
        else:
            self._totals.reset()
            for num_micro_batches, num_updates in calls:
                self._train_function(num_micro_batches)(iterator, tf.constant(num_updates))
                after_call(num_micro_batches * num_updates, num_updates)
            mean_loss = self._totals.mean()
        logs = epoch_logs(mean_loss, self.metrics)
        report_epoch(bar, logs, epoch, epochs, self.verbose)
        return logs

    def _train_function(self, num_micro_batches: int) -> Any:
        """The (cached) tf.function making updates of ``num_micro_batches`` batches each."""
        if num_micro_batches not in self._train_functions:
            self._train_functions[num_micro_batches] = make_train_function(
                self.strategy, self._replica_step, num_micro_batches
            )
        return self._train_functions[num_micro_batches]

    def _count(self, batches: int, updates: int) -> None:
        """Count a call's batches and updates; save a checkpoint when one is due."""
        self.steps += batches
        self.run_step += batches
        self.updates += updates
        every = self.checkpoint_every_steps
        if every and self.run_step // every != (self.run_step - batches) // every:
            self.save_checkpoint()

    @property
    def coordinator(self) -> Any:
        """The ``ClusterCoordinator`` used under ParameterServerStrategy (None otherwise)."""
        if self._coordinator_loop is None:
            return None
        return self._coordinator_loop.coordinator

    def per_worker_iterator(self, data: DataLike) -> Any:
        """Under ParameterServerStrategy, the per-worker iterator ``fit`` reads ``data`` from: a
        dataset function gets an ``InputContext`` whose ``input_pipeline_id`` is its worker."""
        if self._coordinator_loop is None:
            raise ValueError("per_worker_iterator needs a ParameterServerStrategy")
        return self._coordinator_loop.per_worker_iterator(data)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, data: DataLike, steps: int | None = None) -> dict[str, float]:
        """Mean loss (and metrics) over ``data`` without training (not under parameter servers)."""
        if self.is_parameter_server:
            raise UnsupportedByKeras3Error(
                "evaluate() runs on workers; under ParameterServerStrategy evaluate on the "
                "coordinator with trainer.model(x) instead"
            )
        self._build(element_spec(data))
        steps = count_steps(data, steps)
        if self._eval_function is None:
            self._eval_function = make_eval_function(
                self.strategy, self.model, self.loss_fn, self.metrics, self._totals
            )
        self._totals.reset()
        reset_metrics(self.metrics)
        self._eval_function(iter(distribute(self.strategy, data)), tf.constant(steps))
        return epoch_logs(self._totals.mean(), self.metrics)

    def __repr__(self) -> str:
        return (
            f"Trainer(strategy={type(self.strategy).__name__}, "
            f"replicas={self.strategy.num_replicas_in_sync}, "
            f"accumulation_steps={self.accumulation_steps}, "
            f"mixed_precision={self.mixed_precision!r}, steps={self.steps})"
        )


def _at_least_one(name: str, value: int) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an integer >= 1."""
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_created_in_scope(
    strategy: tf.distribute.Strategy, variables: Sequence[Any], where: str
) -> None:
    """Raise a ValueError naming ``where`` for a variable made outside ``strategy.scope()``."""
    for variable in variables:
        tf_variable = getattr(variable, "value", variable)
        tf_variable = getattr(variable, "_value", tf_variable)  # Keras 3 keeps it private
        if not strategy.extended.variable_created_in_scope(tf_variable):
            made = "model" if where == "model_fn" else "optimizer"
            raise ValueError(
                f"{where} returned an object built outside strategy.scope() (variable "
                f"{getattr(variable, 'path', variable.name)!r}). Create the {made} inside "
                f"{where} instead of returning one made earlier."
            )
