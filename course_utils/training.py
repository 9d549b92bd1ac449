"""One correct distributed training loop for Keras 3 models under any ``tf.distribute`` strategy.

Keras 3 ``model.fit`` fails under MultiWorkerMirroredStrategy and ParameterServerStrategy, and its
``gradient_accumulation_steps`` fails under MirroredStrategy. :class:`Trainer` is the custom loop
the lessons teach, written once and tested:

* per-example losses are averaged over the **global** batch (``tf.nn.compute_average_loss`` with
  keyword arguments), regularization losses are scaled per replica
  (``tf.nn.scale_regularization_loss``), and the reported loss is the true mean;
* batches that do not split evenly over the replicas (a short last batch) give the same update
  and loss as on one device, because the global batch size is counted, not assumed;
* ``accumulation_steps=k`` applies one update per ``k`` batches, equal to one update on a batch
  ``k`` times larger, on one device and under (multi-worker) mirrored strategies;
* mixed precision (``"mixed_float16"``, ``"mixed_bfloat16"``) without changing Keras's global
  policy, a ``LossScaleOptimizer`` for float16, and non-finite steps skipped on every replica;
* parameter-server training through ``ClusterCoordinator``, with step counts, losses and metrics
  computed on the coordinator (Keras 3's own counters lose updates there);
* ``checkpoint_dir`` for fault tolerance: a restarted job resumes where it stopped.

Example::

    trainer = Trainer(model_fn, optimizer_fn, loss_fn, strategy=strategy)
    history = trainer.fit(dataset, epochs=3)
    history["loss"]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.environment import import_tensorflow

tf = import_tensorflow()  # quietly: TensorFlow's start-up noise stays out of notebooks

import keras  # noqa: E402  (after TensorFlow, which must be imported quietly first)

__all__ = [
    "PRECISION_POLICIES",
    "Trainer",
    "UnsupportedByKeras3Error",
    "in_notebook",
]

#: Precision policies the Trainer accepts (``None`` means float32).
PRECISION_POLICIES = (None, "float32", "mixed_float16", "mixed_bfloat16")

_TF_KERAS_HINT = (
    "Keras 3 cannot do this under ParameterServerStrategy (keras-team/keras#18624). The working "
    "path is tf_keras: set TF_USE_LEGACY_KERAS=1 before importing TensorFlow (in every process) "
    "and use tf_keras models with a custom ClusterCoordinator loop."
)

DataLike = Any  # a tf.data.Dataset of global batches, or a function InputContext -> Dataset


class UnsupportedByKeras3Error(NotImplementedError):
    """Raised for what Keras 3 cannot do under a strategy (the message names the working path)."""


def in_notebook() -> bool:
    """Return True when running inside a Jupyter (ipykernel) kernel."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython always comes with ipykernel
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def _is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True for the task that writes checkpoints (the chief, worker 0, or a single process)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or _is_parameter_server(strategy):
        return True
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in spec


def _batch_size(structure: Any) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(structure)[0])[0]


def _static_batch_size(structure: Any) -> int | None:
    return tf.nest.flatten(structure)[0].shape[0]


def _unpack(batch: Any) -> tuple[Any, Any, Any]:
    if isinstance(batch, dict) or not isinstance(batch, (tuple, list)):
        raise ValueError(
            "each batch must be a tuple (x, y) or (x, y, sample_weight), got "
            f"{type(batch).__name__}"
        )
    if len(batch) == 2:
        return batch[0], batch[1], None
    if len(batch) == 3:
        return batch[0], batch[1], batch[2]
    raise ValueError(f"each batch must be (x, y) or (x, y, sample_weight), got {len(batch)} parts")


def _auto_accuracy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Accuracy that picks binary, sparse or one-hot categorical from the shapes (as compile())."""
    if y_pred.shape[-1] == 1:
        return keras.metrics.binary_accuracy(y_true, y_pred)
    if y_true.shape.rank == y_pred.shape.rank - 1 or y_true.shape[-1] == 1:
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)
    return keras.metrics.categorical_accuracy(y_true, y_pred)


def _copy_metric(metric: Any) -> keras.metrics.Metric:
    """A fresh metric of the same kind (its variables are created where this is called)."""
    if metric in ("accuracy", "acc"):
        return keras.metrics.MeanMetricWrapper(_auto_accuracy, name=metric)
    if isinstance(metric, str) or (
        callable(metric) and not isinstance(metric, keras.metrics.Metric)
    ):
        found = keras.metrics.get(metric)
        if isinstance(found, keras.metrics.Metric):
            return found.__class__.from_config(found.get_config())
        name = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
        return keras.metrics.MeanMetricWrapper(found, name=name)
    if not isinstance(metric, keras.metrics.Metric):
        raise ValueError(f"metrics must be keras.metrics.Metric objects or names, got {metric!r}")
    try:
        return metric.__class__.from_config(metric.get_config())
    except Exception:  # noqa: BLE001 - some metrics need deserialize()
        return keras.metrics.deserialize(keras.metrics.serialize(metric))


class Trainer:
    """Train a Keras 3 model with a custom loop under any ``tf.distribute`` strategy.

    Args:
        model_fn: ``() -> keras.Model``, called inside ``strategy.scope()`` (and inside the
            precision policy).
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
        verbose: ``"auto"`` (a progress bar only in a notebook), 0 (quiet), 1 (progress bar) or
            2 (one line per epoch).

    With ``accumulation_steps=k`` an epoch of ``n`` batches makes ``n // k`` updates; a last group
    of fewer than ``k`` batches makes one more update from the examples it has. A step is one
    batch, as in Keras: ``trainer.steps`` counts batches, ``trainer.updates`` optimizer updates.
    """

    def __init__(
        self,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        loss_fn: Callable[[Any, Any], tf.Tensor],
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
        if mixed_precision not in PRECISION_POLICIES:
            raise ValueError(
                f"unknown precision policy {mixed_precision!r}; use one of "
                f"{', '.join(repr(p) for p in PRECISION_POLICIES)}"
            )
        if int(accumulation_steps) != accumulation_steps or accumulation_steps < 1:
            raise ValueError(
                f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}"
            )
        if int(steps_per_execution) != steps_per_execution or steps_per_execution < 1:
            raise ValueError(
                f"steps_per_execution must be an integer >= 1, got {steps_per_execution!r}"
            )
        if verbose not in ("auto", 0, 1, 2, True, False):
            raise ValueError(f"verbose must be 'auto', 0, 1 or 2, got {verbose!r}")
        self.strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        self.loss_fn = loss_fn
        self.accumulation_steps = int(accumulation_steps)
        self.mixed_precision = None if mixed_precision == "float32" else mixed_precision
        self.steps_per_execution = int(steps_per_execution)
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_every_steps = checkpoint_every_steps
        self.max_checkpoints = max_checkpoints
        self.verbose = verbose
        self.is_parameter_server = _is_parameter_server(self.strategy)
        self.is_chief = _is_chief(self.strategy)
        #: Batches trained by this Trainer (counted on the host, exact under parameter servers).
        self.steps = 0
        #: Optimizer updates applied (steps / accumulation_steps, counted on the host).
        self.updates = 0
        #: Batches done in the current run (what a checkpoint stores to resume).
        self.run_step = 0
        #: The run step a checkpoint was restored from, or None.
        self.resumed_from_step: int | None = None
        self._coordinator = None
        self._train_fns: dict[int, Any] = {}
        self._eval_fn = None
        self._restore_checked = False
        self._built = False

        if self.is_parameter_server and getattr(
            self.strategy.extended, "_variable_partitioner", None
        ):
            raise UnsupportedByKeras3Error(
                "ParameterServerStrategy with a variable_partitioner creates ShardedVariables, "
                "which Keras 3 layers and optimizers cannot train ('ShardedVariable' object has "
                "no attribute 'handle'). Create the strategy without variable_partitioner. "
                + _TF_KERAS_HINT
            )

        previous_policy = keras.config.dtype_policy()
        try:
            if self.mixed_precision is not None:
                keras.mixed_precision.set_dtype_policy(self.mixed_precision)
            with self.strategy.scope():
                self.model = model_fn()
                if not isinstance(self.model, keras.Model):
                    raise ValueError(f"model_fn must return a keras.Model, got {self.model!r}")
                optimizer = optimizer_fn()
                if self.mixed_precision == "mixed_float16" and not isinstance(
                    optimizer, keras.optimizers.LossScaleOptimizer
                ):
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                self.optimizer = optimizer
                self._check_created_in_scope(self.model.variables, "model_fn")
                self._check_created_in_scope(self.optimizer.variables, "optimizer_fn")
                if self.is_parameter_server:
                    self._loss_sum = self._count = None
                else:
                    sync = dict(
                        trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM,
                    )
                    self._loss_sum = tf.Variable(0.0, name="trainer_loss_sum", **sync)
                    self._count = tf.Variable(0.0, name="trainer_example_count", **sync)
                    self.metrics = [_copy_metric(m) for m in metrics]
                counter = dict(
                    trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
                )
                self._ckpt_run_step = tf.Variable(0, dtype=tf.int64, name="run_step", **counter)
                self._ckpt_completed = tf.Variable(0, dtype=tf.int64, name="completed", **counter)
        finally:
            keras.mixed_precision.set_dtype_policy(previous_policy)
        if self.is_parameter_server:
            # Metrics live on the coordinator, fed with values the workers return.
            self.metrics = [_copy_metric(m) for m in metrics]
        if self.model.built:
            self._build(None)

    # ------------------------------------------------------------------ building
    def _check_created_in_scope(self, variables: Sequence[Any], where: str) -> None:
        for variable in variables:
            tf_variable = getattr(variable, "value", variable)
            tf_variable = getattr(variable, "_value", tf_variable)
            if not self.strategy.extended.variable_created_in_scope(tf_variable):
                raise ValueError(
                    f"{where} returned an object built outside strategy.scope() (variable "
                    f"{getattr(variable, 'path', variable.name)!r}). Create the model and the "
                    f"optimizer inside {where} instead of returning one made earlier."
                )

    def _build(self, element_spec: Any) -> None:
        """Build the model and the optimizer inside the scope before the first step."""
        if self._built:
            return
        with self.strategy.scope():
            if not self.model.built:
                if element_spec is None:
                    raise ValueError("the model is not built; pass data so its shape is known")
                x_spec = _unpack(element_spec)[0]
                shapes = tf.nest.map_structure(lambda s: s.shape, x_spec)
                previous_policy = keras.config.dtype_policy()
                try:
                    if self.mixed_precision is not None:
                        keras.mixed_precision.set_dtype_policy(self.mixed_precision)
                    self.model.build(shapes)
                finally:
                    keras.mixed_precision.set_dtype_policy(previous_policy)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)
        self._check_created_in_scope(self.model.variables, "model_fn")
        self._built = True

    # ------------------------------------------------------------------ the step
    def _per_example_loss(self, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
        y_pred = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), y_pred)
        per_example = tf.cast(self.loss_fn(y, y_pred), tf.float32)
        if per_example.shape.rank == 0:
            raise ValueError(
                "loss_fn returned a scalar; it must return per-example losses of shape [batch] "
                "(for a Keras loss use reduction=None)"
            )
        if per_example.shape.rank is not None and per_example.shape.rank > 1:
            per_example = tf.reduce_mean(per_example, axis=list(range(1, per_example.shape.rank)))
        if sample_weight is not None:
            per_example = per_example * tf.cast(tf.reshape(sample_weight, [-1]), tf.float32)
        return per_example

    def _replica_step(self, *batches: Any) -> Any:
        """One optimizer update from ``len(batches)`` micro-batches, in replica context."""
        context = tf.distribute.get_replica_context()
        num_micro = len(batches)
        unpacked = [_unpack(b) for b in batches]
        n_local = tf.add_n([tf.cast(_batch_size(y), tf.int64) for _, y, _ in unpacked])
        static = [_static_batch_size(y) for _, y, _ in unpacked]
        if self.is_parameter_server:
            n_global = n_local  # each worker's step is its own global batch
        elif all(s is not None for s in static):
            n_global = tf.constant(sum(static) * self.strategy.num_replicas_in_sync, tf.int64)
        else:
            # float32 all-reduce: TPUs have no int64 collectives (exact up to 2**24 examples).
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(n_local, tf.float32))
            n_global = tf.cast(summed, tf.int64)
        variables = self.model.trainable_variables
        total_grads: list[Any] = [None] * len(variables)
        total_loss = tf.constant(0.0)
        dependencies: list[tf.Tensor] = []
        y_trues, y_preds = [], []
        scale_loss = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        for x, y, sample_weight in unpacked:
            # Micro-batches run one after the other, so only one holds its activations.
            with tf.control_dependencies(dependencies):
                with tf.GradientTape() as tape:
                    y_pred = self.model(x, training=True)
                    per_example = self._per_example_loss(y, y_pred, sample_weight)
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=n_global)
                    if self.model.losses:
                        regularization = tf.add_n(
                            [tf.cast(t, tf.float32) for t in self.model.losses]
                        )
                        loss += tf.nn.scale_regularization_loss(regularization) / num_micro
                    scaled = self.optimizer.scale_loss(loss) if scale_loss else loss
                grads = tape.gradient(scaled, variables)
            total_grads = [
                g if acc is None else (acc if g is None else acc + g)
                for acc, g in zip(total_grads, grads, strict=True)
            ]
            dependencies = [g for g in grads if g is not None]
            total_loss += loss
            y_pred32 = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), y_pred)
            if self.is_parameter_server:
                y_trues.append(y)
                y_preds.append(y_pred32)
            else:
                for metric in self.metrics:
                    metric.update_state(y, y_pred32, sample_weight=sample_weight)
        if scale_loss and not self.is_parameter_server and self.strategy.num_replicas_in_sync > 1:
            total_grads = self._skip_everywhere_if_not_finite(context, total_grads)
        self.optimizer.apply(total_grads, variables)
        if self.is_parameter_server:
            y_true = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *y_trues)
            y_pred = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *y_preds)
            count = tf.cast(n_global, tf.float32)
            return total_loss * count, count, y_true, y_pred
        self._loss_sum.assign_add(total_loss * tf.cast(n_global, tf.float32))
        self._count.assign_add(tf.cast(n_local, tf.float32))
        return None

    @staticmethod
    def _skip_everywhere_if_not_finite(context: Any, grads: list[Any]) -> list[Any]:
        """Poison every replica's gradients when any replica's are not finite.

        Keras's LossScaleOptimizer decides from the first replica's (not yet all-reduced)
        gradients, so an inf on another replica would be applied. Agreeing first makes every
        replica skip the step and lower the loss scale together.
        """
        present = [g for g in grads if g is not None]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present])
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
        first = next(i for i, g in enumerate(grads) if g is not None)
        poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(1.0))
        grads = list(grads)
        grads[first] = grads[first] * tf.cast(poison, grads[first].dtype)
        return grads

    def _train_function(self, num_micro: int) -> Any:
        """A tf.function running ``num_updates`` updates of ``num_micro`` batches each."""
        if num_micro not in self._train_fns:
            strategy = self.strategy

            @tf.function
            def train_fn(iterator: Any, num_updates: tf.Tensor) -> None:
                for _ in tf.range(num_updates):
                    batches = tuple(next(iterator) for _ in range(num_micro))
                    strategy.run(self._replica_step, args=batches)

            self._train_fns[num_micro] = train_fn
        return self._train_fns[num_micro]

    def _ps_function(self, num_micro: int, num_updates: int) -> Any:
        """A tf.function for one worker closure: its loss sum, example count, y and y_pred."""
        key = (num_micro, num_updates)
        if key not in self._train_fns:
            strategy = self.strategy

            @tf.function
            def worker_fn(iterator: Any) -> Any:
                results = []
                for _ in range(num_updates):
                    batches = tuple(next(iterator) for _ in range(num_micro))
                    results.append(strategy.run(self._replica_step, args=batches))
                loss = tf.add_n([r[0] for r in results])
                count = tf.add_n([r[1] for r in results])
                y_true = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *[r[2] for r in results])
                y_pred = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *[r[3] for r in results])
                return loss, count, y_true, y_pred

            self._train_fns[key] = worker_fn
        return self._train_fns[key]

    # ------------------------------------------------------------------ data
    def _steps_per_epoch(self, data: DataLike, steps_per_epoch: int | None) -> int:
        if steps_per_epoch is not None:
            if int(steps_per_epoch) != steps_per_epoch or steps_per_epoch < 1:
                raise ValueError(
                    f"steps_per_epoch must be a positive integer, got {steps_per_epoch}"
                )
            return int(steps_per_epoch)
        if self.is_parameter_server:
            raise ValueError("parameter-server training needs steps_per_epoch (datasets repeat)")
        if not isinstance(data, tf.data.Dataset):
            raise ValueError("pass steps_per_epoch when data is a dataset function")
        cardinality = int(data.cardinality())
        if cardinality == tf.data.INFINITE_CARDINALITY:
            raise ValueError("the dataset repeats forever: pass steps_per_epoch")
        if cardinality < 0:
            raise ValueError(
                "the dataset's length is unknown (filter()? take() on a generator?): pass "
                "steps_per_epoch, or use repeat() with steps_per_epoch"
            )
        if cardinality == 0:
            raise ValueError("the dataset is empty")
        return cardinality

    def _element_spec(self, data: DataLike) -> Any:
        if isinstance(data, tf.data.Dataset):
            return data.element_spec
        if callable(data):
            return data(tf.distribute.InputContext()).element_spec
        raise ValueError(
            "data must be a tf.data.Dataset of global batches (x, y) or a function of a "
            f"tf.distribute.InputContext returning one, got {type(data).__name__}"
        )

    def _distribute(self, data: DataLike) -> Any:
        if isinstance(data, tf.data.Dataset):
            return self.strategy.experimental_distribute_dataset(data)
        return self.strategy.distribute_datasets_from_function(data)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> tf.train.Checkpoint:
        if not hasattr(self, "_ckpt"):
            self._ckpt = tf.train.Checkpoint(
                model=self.model,
                optimizer=self.optimizer,
                run_step=self._ckpt_run_step,
                completed=self._ckpt_completed,
            )
            self._ckpt_manager = tf.train.CheckpointManager(
                self._ckpt, self.checkpoint_dir, max_to_keep=self.max_checkpoints
            )
        return self._ckpt

    def latest_checkpoint(self) -> str | None:
        """Path of the newest checkpoint in ``checkpoint_dir`` (None when there is none)."""
        if self.checkpoint_dir is None:
            return None
        return tf.train.latest_checkpoint(self.checkpoint_dir)

    def save_checkpoint(self, completed: bool = False) -> str | None:
        """Write a checkpoint (every worker must call this; only the chief keeps its files)."""
        if self.checkpoint_dir is None:
            return None
        checkpoint = self._checkpoint()
        self._ckpt_run_step.assign(self.run_step)
        self._ckpt_completed.assign(int(completed))
        if self.is_chief:
            return self._ckpt_manager.save(checkpoint_number=self.run_step)
        # Non-chief workers take part in the save but write to a directory they delete.
        scratch = tempfile.mkdtemp(prefix="worker_ckpt_")
        try:
            checkpoint.write(os.path.join(scratch, "ckpt"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def restore(self, path: str | None = None) -> bool:
        """Restore the model, optimizer and run counter from a checkpoint; True if one was read."""
        path = path or self.latest_checkpoint()
        if path is None:
            return False
        self._checkpoint().restore(path).expect_partial()
        self.run_step = int(self._ckpt_run_step.numpy())
        return True

    def _maybe_resume(self) -> None:
        if self._restore_checked or self.checkpoint_dir is None:
            return
        self._restore_checked = True
        latest = self.latest_checkpoint()
        if latest is None:
            return
        completed = int(tf.train.load_variable(latest, "completed/.ATTRIBUTES/VARIABLE_VALUE"))
        if completed:
            return  # the last run finished: start a new run (like keras BackupAndRestore)
        self.restore(latest)
        self.resumed_from_step = self.run_step

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
        is called after each epoch's checkpoint.
        """
        if int(epochs) != epochs or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        spec = self._element_spec(data)
        self._build(spec)
        steps = self._steps_per_epoch(data, steps_per_epoch)
        self._maybe_resume()
        if self.resumed_from_step is None or self._completed_last_run():
            self.run_step = 0
        start_epoch, done_in_epoch = divmod(self.run_step, steps)
        history: dict[str, list[float]] = {"loss": []}
        for metric in self.metrics:
            history[metric.name] = []
        persistent = steps_per_epoch is not None
        iterator = None
        for epoch in range(start_epoch, epochs):
            todo = steps - done_in_epoch
            if self.is_parameter_server:
                if iterator is None:
                    iterator = self._ps_iterator(data)
                logs = self._run_epoch_ps(iterator, todo, epoch, epochs)
            else:
                if persistent:
                    if iterator is None:
                        iterator = iter(self._distribute(data))
                    epoch_iterator = iterator
                else:
                    epoch_data = data.skip(done_in_epoch) if done_in_epoch else data
                    epoch_iterator = iter(self._distribute(epoch_data))
                logs = self._run_epoch(epoch_iterator, todo, epoch, epochs)
            done_in_epoch = 0
            for key, value in logs.items():
                history.setdefault(key, []).append(value)
            self.save_checkpoint(completed=epoch == epochs - 1)
            if on_epoch_end is not None:
                on_epoch_end(epoch, logs)
        self._last_run_completed = True
        return history

    def _completed_last_run(self) -> bool:
        return getattr(self, "_last_run_completed", False)

    def _progress(self, total: int, epoch: int, epochs: int) -> Any:
        show = (
            self.verbose == 1 or self.verbose is True or (self.verbose == "auto" and in_notebook())
        )
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"epoch {epoch + 1}/{epochs}", unit="step", leave=True)

    def _report(self, bar: Any, logs: dict[str, float], epoch: int, epochs: int) -> None:
        text = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
        if bar is not None:
            bar.set_postfix_str(text)
            bar.close()
        elif self.verbose == 2:
            print(f"epoch {epoch + 1}/{epochs} - {text}")

    def _updates_in(self, todo: int) -> list[tuple[int, int]]:
        """Split ``todo`` batches into (micro-batches per update, number of updates) calls."""
        k, spe = self.accumulation_steps, self.steps_per_execution
        full, rest = divmod(todo, k)
        calls = [(k, min(spe, full - i)) for i in range(0, full, spe)]
        if rest:
            calls.append((rest, 1))
        return calls

    def _after_call(self, batches: int, updates: int) -> None:
        self.steps += batches
        self.run_step += batches
        self.updates += updates
        every = self.checkpoint_every_steps
        if every and self.run_step // every != (self.run_step - batches) // every:
            self.save_checkpoint()

    def _run_epoch(self, iterator: Any, todo: int, epoch: int, epochs: int) -> dict[str, float]:
        self._loss_sum.assign(0.0)
        self._count.assign(0.0)
        for metric in self.metrics:
            metric.reset_state()
        bar = self._progress(todo, epoch, epochs)
        for num_micro, num_updates in self._updates_in(todo):
            self._train_function(num_micro)(iterator, tf.constant(num_updates))
            self._after_call(num_micro * num_updates, num_updates)
            if bar is not None:
                bar.update(num_micro * num_updates)
        logs = {"loss": float(self._loss_sum.numpy() / max(self._count.numpy(), 1.0))}
        for metric in self.metrics:
            logs[metric.name] = float(metric.result())
        self._report(bar, logs, epoch, epochs)
        return logs

    # ------------------------------------------------------------------ parameter servers
    @property
    def coordinator(self) -> Any:
        """The ``ClusterCoordinator`` used under ParameterServerStrategy (None otherwise)."""
        if self.is_parameter_server and self._coordinator is None:
            self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
                self.strategy
            )
        return self._coordinator

    def _ps_iterator(self, data: DataLike) -> Any:
        coordinator = self.coordinator
        if isinstance(data, tf.data.Dataset):
            per_worker = coordinator.create_per_worker_dataset(data)
        else:

            def per_worker_dataset_fn() -> Any:
                return self.strategy.distribute_datasets_from_function(data)

            per_worker = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
        return iter(per_worker)

    def _run_epoch_ps(self, iterator: Any, todo: int, epoch: int, epochs: int) -> dict[str, float]:
        for metric in self.metrics:
            metric.reset_state()
        bar = self._progress(todo, epoch, epochs)
        scheduled = []
        for num_micro, num_updates in self._updates_in(todo):
            worker_fn = self._ps_function(num_micro, num_updates)
            remote = self.coordinator.schedule(worker_fn, args=(iterator,))
            scheduled.append((remote, num_micro * num_updates, num_updates))
        self.coordinator.join()
        # Count steps, losses and metrics here, from the values each closure returned: Keras 3's
        # optimizer.iterations and metric variables lose concurrent updates on parameter servers.
        loss_sum = count = 0.0
        for remote, batches, updates in scheduled:
            loss, n, y_true, y_pred = remote.fetch()
            loss_sum += float(loss)
            count += float(n)
            for metric in self.metrics:
                metric.update_state(y_true, y_pred)
            self._after_call(batches, updates)
            if bar is not None:
                bar.update(batches)
        logs = {"loss": loss_sum / max(count, 1.0)}
        for metric in self.metrics:
            logs[metric.name] = float(metric.result())
        self._report(bar, logs, epoch, epochs)
        return logs

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, data: DataLike, steps: int | None = None) -> dict[str, float]:
        """Mean loss (and metrics) over ``data`` without training (not under parameter servers)."""
        if self.is_parameter_server:
            raise UnsupportedByKeras3Error(
                "evaluate() runs on workers; under ParameterServerStrategy evaluate on the "
                "coordinator with trainer.model(x) instead"
            )
        self._build(self._element_spec(data))
        steps = self._steps_per_epoch(data, steps)
        if self._eval_fn is None:
            strategy = self.strategy

            def replica_eval(batch: Any) -> None:
                x, y, sample_weight = _unpack(batch)
                y_pred = self.model(x, training=False)
                per_example = self._per_example_loss(y, y_pred, sample_weight)
                self._loss_sum.assign_add(tf.reduce_sum(per_example))
                self._count.assign_add(tf.cast(_batch_size(y), tf.float32))
                y_pred32 = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), y_pred)
                for metric in self.metrics:
                    metric.update_state(y, y_pred32, sample_weight=sample_weight)

            @tf.function
            def eval_fn(iterator: Any, num_steps: tf.Tensor) -> None:
                for _ in tf.range(num_steps):
                    strategy.run(replica_eval, args=(next(iterator),))

            self._eval_fn = eval_fn
        self._loss_sum.assign(0.0)
        self._count.assign(0.0)
        for metric in self.metrics:
            metric.reset_state()
        self._eval_fn(iter(self._distribute(data)), tf.constant(steps))
        logs = {"loss": float(self._loss_sum.numpy() / max(self._count.numpy(), 1.0))}
        for metric in self.metrics:
            logs[metric.name] = float(metric.result())
        return logs

    def __repr__(self) -> str:
        return (
            f"Trainer(strategy={type(self.strategy).__name__}, "
            f"replicas={self.strategy.num_replicas_in_sync}, "
            f"accumulation_steps={self.accumulation_steps}, "
            f"mixed_precision={self.mixed_precision!r}, steps={self.steps})"
        )
