"""What an epoch reports: the true mean loss and the Keras metrics.

The loss is summed on every replica into two sync-on-read variables (loss times examples, and
examples) and divided once when read: the mean over the real examples, whatever the number of
replicas (a ``Mean`` metric of the scaled loss would be off by the replica count,
tensorflow#40339).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.quiet import import_tensorflow

tf = import_tensorflow()

import keras  # noqa: E402  (after TensorFlow, which must be imported quietly first)

__all__ = ["LossTotals", "copy_metric", "epoch_logs", "reset_metrics"]


def copy_metric(metric: Any) -> keras.metrics.Metric:
    """A fresh metric of the same kind (its variables are created where this is called).

    ``"accuracy"`` (or ``"acc"``) picks binary, sparse or one-hot categorical accuracy from the
    shapes, as ``compile()`` does.
    """
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


def _auto_accuracy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Accuracy that picks binary, sparse or one-hot categorical from the shapes (as compile())."""
    if y_pred.shape[-1] == 1:
        return keras.metrics.binary_accuracy(y_true, y_pred)
    if y_true.shape.rank == y_pred.shape.rank - 1 or y_true.shape[-1] == 1:
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)
    return keras.metrics.categorical_accuracy(y_true, y_pred)


def reset_metrics(metrics: Sequence[keras.metrics.Metric]) -> None:
    """Reset every metric's state (at the start of an epoch or an evaluation)."""
    for metric in metrics:
        metric.reset_state()


def epoch_logs(mean_loss: float, metrics: Sequence[keras.metrics.Metric]) -> dict[str, float]:
    """The epoch's logs: ``{"loss": mean_loss, <metric name>: <result>, ...}``."""
    logs = {"loss": mean_loss}
    for metric in metrics:
        logs[metric.name] = float(metric.result())
    return logs


class LossTotals:
    """The summed loss and example count of an epoch, summed over the replicas when read.

    Create it inside ``strategy.scope()``; call :meth:`add` in replica context.
    """

    def __init__(self) -> None:
        sync = dict(
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )
        self.loss_sum = tf.Variable(0.0, name="trainer_loss_sum", **sync)
        self.count = tf.Variable(0.0, name="trainer_example_count", **sync)

    def reset(self) -> None:
        """Start a new epoch (or evaluation) from zero."""
        self.loss_sum.assign(0.0)
        self.count.assign(0.0)

    def add(self, loss_sum: tf.Tensor, count: tf.Tensor) -> None:
        """Add this replica's summed loss and its number of examples."""
        self.loss_sum.assign_add(loss_sum)
        self.count.assign_add(count)

    def mean(self) -> float:
        """The mean loss per example so far (0 before any example)."""
        return float(self.loss_sum.numpy() / max(self.count.numpy(), 1.0))
