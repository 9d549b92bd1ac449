"""Parameter-server training: the ``ClusterCoordinator`` path.

Under ``ParameterServerStrategy`` this Python process is the coordinator: it trains nothing
itself, it schedules functions on the workers (``coordinator.schedule``), waits for them
(``join``) and fetches what they returned. Keras 3 ``fit`` cannot do this
(keras-team/keras#18624), and Keras 3's own counters (``optimizer.iterations``, metric variables)
lose concurrent updates from several workers, so the steps, the loss and the metrics are counted
here, on the coordinator, from the values each scheduled function returns. The optimizer's own
``iterations`` still counts with Keras 3's read-then-write and can fall short of the steps run
(lesson 04 measures it): a learning-rate schedule or Adam's bias correction reads that count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_utils.quiet import import_tensorflow
from course_utils.training.batches import DataLike, concat_batches

tf = import_tensorflow()

__all__ = [
    "TF_KERAS_HINT",
    "CoordinatorLoop",
    "UnsupportedByKeras3Error",
    "is_parameter_server",
    "make_worker_function",
    "refuse_variable_partitioner",
]

TF_KERAS_HINT = (
    "Keras 3 cannot do this under ParameterServerStrategy (keras-team/keras#18624). The working "
    "path is tf_keras: set TF_USE_LEGACY_KERAS=1 before importing TensorFlow (in every process) "
    "and use tf_keras models with a custom ClusterCoordinator loop."
)


class UnsupportedByKeras3Error(NotImplementedError):
    """Raised for what Keras 3 cannot do under a strategy (the message names the working path)."""


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    """True for a ``ParameterServerStrategy``."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def refuse_variable_partitioner(strategy: tf.distribute.Strategy) -> None:
    """Raise UnsupportedByKeras3Error for a ParameterServerStrategy that shards variables."""
    # The strategy keeps its partitioner private; there is no public way to ask for it.
    if is_parameter_server(strategy) and getattr(strategy.extended, "_variable_partitioner", None):
        raise UnsupportedByKeras3Error(
            "ParameterServerStrategy with a variable_partitioner makes a ShardedVariable of "
            "every variable it splits (a MinSizePartitioner splits only large ones), which Keras "
            "3 layers and optimizers cannot train ('ShardedVariable' object has no attribute "
            "'handle'); the Trainer refuses such a strategy before it builds the model, whether "
            "or not it would split this model's variables. Create the strategy without "
            "variable_partitioner. "
            + TF_KERAS_HINT
        )


def make_worker_function(
    strategy: tf.distribute.Strategy,
    replica_step: Callable[..., Any],
    num_micro_batches: int,
    num_updates: int,
) -> Callable[[Any], Any]:
    """A tf.function for one worker closure: its loss sum, example count, labels, predictions."""

    @tf.function
    def worker_function(iterator: Any) -> Any:
        results = []
        for _ in range(num_updates):
            micro_batches = tuple(next(iterator) for _ in range(num_micro_batches))
            results.append(strategy.run(replica_step, args=micro_batches))
        loss_sum = tf.add_n([result[0] for result in results])
        count = tf.add_n([result[1] for result in results])
        labels = concat_batches([result[2] for result in results])
        predictions = concat_batches([result[3] for result in results])
        return loss_sum, count, labels, predictions

    return worker_function


class CoordinatorLoop:
    """Epochs under ParameterServerStrategy: schedule the steps, join, count on the coordinator."""

    def __init__(self, strategy: tf.distribute.Strategy, replica_step: Callable[..., Any]) -> None:
        self.strategy = strategy
        self.replica_step = replica_step
        self._coordinator: Any = None
        self._worker_functions: dict[tuple[int, int], Any] = {}

    @property
    def coordinator(self) -> Any:
        """The ``ClusterCoordinator`` (created on first use)."""
        if self._coordinator is None:
            self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
                self.strategy
            )
        return self._coordinator

    def num_workers(self) -> int:
        """The number of workers in the strategy's cluster.

        The strategy keeps its cluster resolver private (its public ``cluster_resolver`` is
        None); once connected, each worker's devices are this process's remote devices.
        """
        names = [device.name for device in tf.config.list_logical_devices()]
        return len({name.split("/device:")[0] for name in names if "/job:worker/" in name})

    def per_worker_iterator(self, data: DataLike) -> Any:
        """An iterator over a per-worker dataset made from ``data`` (a dataset or function).

        A dataset function runs on each worker with an ``InputContext`` whose
        ``input_pipeline_id`` is that worker's index (a tensor) and ``num_input_pipelines`` the
        number of workers, so it can shard or seed its shuffle per worker. (TensorFlow's own
        ``distribute_datasets_from_function`` passes every worker ``input_pipeline_id=0``:
        ``parameter_server_strategy_v2.py``, ``_distribute_datasets_from_function``.)
        """
        if isinstance(data, tf.data.Dataset):
            return iter(self.coordinator.create_per_worker_dataset(data))
        num_workers = self.num_workers()

        def per_worker_dataset_fn() -> Any:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()

            def on_this_worker(context: tf.distribute.InputContext) -> Any:
                return data(
                    tf.distribute.InputContext(
                        num_input_pipelines=num_workers,
                        input_pipeline_id=worker,
                        num_replicas_in_sync=context.num_replicas_in_sync,
                    )
                )

            return self.strategy.distribute_datasets_from_function(on_this_worker)

        return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    def worker_function(self, num_micro_batches: int, num_updates: int) -> Any:
        """The (cached) worker function making ``num_updates`` updates."""
        key = (num_micro_batches, num_updates)
        if key not in self._worker_functions:
            self._worker_functions[key] = make_worker_function(
                self.strategy, self.replica_step, num_micro_batches, num_updates
            )
        return self._worker_functions[key]

    def run_epoch(
        self,
        iterator: Any,
        calls: Sequence[tuple[int, int]],
        metrics: Sequence[Any],
        on_call: Callable[[int, int], None],
    ) -> float:
        """Run ``calls`` of ``(micro-batches, updates)`` on the workers; return the mean loss.

        ``on_call(batches, updates)`` is called once per call after all of them finished.
        """
        scheduled = []
        for num_micro_batches, num_updates in calls:
            function = self.worker_function(num_micro_batches, num_updates)
            remote = self.coordinator.schedule(function, args=(iterator,))
            scheduled.append((remote, num_micro_batches * num_updates, num_updates))
        self.coordinator.join()
        # Count steps, losses and metrics here, from the values each closure returned: Keras 3's
        # optimizer.iterations and metric variables lose concurrent updates on parameter servers.
        loss_sum = count = 0.0
        for remote, batches, updates in scheduled:
            loss, examples, labels, predictions = remote.fetch()
            loss_sum += float(loss)
            count += float(examples)
            for metric in metrics:
                metric.update_state(labels, predictions)
            on_call(batches, updates)
        return loss_sum / max(count, 1.0)
