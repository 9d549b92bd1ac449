"""The small job every cell runs: the same data, the same initial weights, a one-device reference.

A two-layer classifier trained with SGD for a few global batches. Each API is trained from the
same initial weights on the same global batches; on one device, in plain TensorFlow, the same
steps give the reference weights a correct distributed run must reproduce.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Task", "make_task", "task_loss"]


@dataclass
class Task:
    """Features, labels and initial weights of the job; ``global_batch`` examples per step."""

    x: np.ndarray
    y: np.ndarray
    initial_weights: list[np.ndarray]
    global_batch: int
    learning_rate: float = 0.1
    hidden: int = 16
    _reference: list[np.ndarray] | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        """Global batches in one pass over the data."""
        return len(self.x) // self.global_batch

    @property
    def num_features(self) -> int:
        """Inputs per example."""
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        """Classes of the labels."""
        return int(self.initial_weights[-1].shape[0])

    def dataset(self, batch: int | None = None) -> Any:
        """The data as a ``tf.data.Dataset`` of batches (default: global batches), in order."""
        import tensorflow as tf

        data = tf.data.Dataset.from_tensor_slices((self.x, self.y))
        return data.batch(batch or self.global_batch, drop_remainder=True)

    def keras_model(self) -> Any:
        """A Keras 3 model with the initial weights (call it inside the strategy's scope)."""
        import keras

        return self._model(keras)

    def tf_keras_model(self) -> Any:
        """The same model in tf_keras (Keras 2), with the same initial weights."""
        import tf_keras

        return self._model(tf_keras)

    def _model(self, keras_module: Any) -> Any:
        layers = keras_module.layers
        model = keras_module.Sequential([keras_module.Input((self.num_features,)),
                                         layers.Dense(self.hidden, activation="relu",
                                                      name="hidden"),
                                         layers.Dense(self.num_classes)])
        model.set_weights(self.initial_weights)
        return model

    def reference_weights(self, skip: Collection[int] = ()) -> list[np.ndarray]:
        """The weights after one pass of plain SGD on one device, batch by batch (cached);
        the steps in ``skip`` (indices) are not applied, as a loss scale skips an overflow."""
        if skip:
            return self._train(set(skip))
        if self._reference is None:
            self._reference = self._train(set())
        return self._reference

    def _train(self, skip: set[int]) -> list[np.ndarray]:
        import tensorflow as tf

        variables = [tf.Variable(w) for w in self.initial_weights]
        for step, start in enumerate(range(0, self.steps * self.global_batch,
                                           self.global_batch)):
            if step not in skip:
                x = self.x[start:start + self.global_batch]
                y = self.y[start:start + self.global_batch]
                with tf.GradientTape() as tape:
                    loss = _mean_loss(tf, variables, x, y)
                gradients = tape.gradient(loss, variables)
                for variable, gradient in zip(variables, gradients, strict=True):
                    variable.assign_sub(self.learning_rate * gradient)
        return [v.numpy() for v in variables]


def _mean_loss(tf: Any, weights: Any, x: Any, y: Any) -> Any:
    w1, b1, w2, b2 = weights
    logits = tf.nn.relu(x @ w1 + b1) @ w2 + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def task_loss(task: Task, weights: list[np.ndarray]) -> float:
    """The mean cross-entropy of ``weights`` on all of the task's data (NumPy, any framework)."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    logits = np.maximum(task.x @ w1 + b1, 0) @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(task.y)), task.y].mean())


def make_task(steps: int = 4, global_batch: int = 16, num_features: int = 8,
              num_classes: int = 3, hidden: int = 16, seed: int = 0) -> Task:
    """A learnable classification task (a random linear teacher) and fixed initial weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * global_batch, num_features)).astype(np.float32)
    teacher = rng.normal(size=(num_features, num_classes))
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    weights = [rng.normal(0, 0.5, (num_features, hidden)), np.zeros(hidden),
               rng.normal(0, 0.5, (hidden, num_classes)), np.zeros(num_classes)]
    return Task(x, y, [w.astype(np.float32) for w in weights], global_batch, hidden=hidden)
