"""Lesson 02 ex 2: the in-batch softmax loss, whose negatives are the whole global batch.

Each query is scored against every key of the batch (``queries @ keys.T``), its own key the
target of a softmax cross-entropy, and the loss is the mean over the batch's queries. Under a
strategy a replica holds only its own pairs: its share of the one-device loss needs every
replica's keys (``ReplicaContext.all_gather``, which TensorFlow differentiates: the gradient
all-reduces the upstream gradient and keeps this replica's rows, ``grad_wrapper`` in
``all_gather``, tensorflow/python/distribute/distribute_lib.py), where this replica's pairs
start among them, and the number of pairs of the whole batch. Scoring against the replica's
own keys – the lesson's counted reduction applied as it is – is another objective, with fewer
negatives, which :func:`measure_pairs` names when it sees it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from course_utils.quiet import import_tensorflow as _tf  # quiet, on first use

__all__ = ["PairMeasurement", "measure_pairs", "pair_data", "pair_loss", "reference_loss"]


def reference_loss(queries: Any, keys: Any) -> float:
    """The in-batch softmax loss in float64: the mean over the queries."""
    import numpy as np

    return float(_losses(np.asarray(queries, np.float64), np.asarray(keys, np.float64)).mean())


def _losses(queries: Any, keys: Any) -> Any:
    import numpy as np

    scores = queries @ keys.T
    scores = scores - scores.max(axis=1, keepdims=True)
    log_probs = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(queries)), np.arange(len(queries))]


def pair_loss(tf: Any, model: Any, batch: Any) -> Any:
    """One device's loss of a batch of pairs ``(query_features, key_features)``."""
    queries, keys = (model(part, training=True) for part in batch)
    scores = tf.matmul(queries, keys, transpose_b=True)
    targets = tf.range(tf.shape(queries)[0])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, scores))


def pair_data(np_rng: Any, features: Any) -> tuple[Any, Any]:
    """Queries' features and their keys' (the queries, noised): pairs a model can match."""
    import numpy as np

    noise = np_rng.normal(scale=0.5, size=features.shape)
    return features.astype(np.float32), (features + noise).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class PairMeasurement:
    """The replicas' losses and gradients on one global batch, summed, against one device."""

    examples_per_replica: tuple[int, ...]
    loss_sum: float  # the replicas' losses, summed
    true_loss: float  # one device's loss of the whole batch
    own_keys_loss: float  # each replica scoring its queries against its own keys only
    gradient_ratio: float  # norm of the summed gradient / norm of one device's
    gradient_error: float  # largest difference from one device's gradient, / its largest

    @property
    def loss_right(self) -> bool:
        return abs(self.loss_sum - self.true_loss) <= 1e-4 * abs(self.true_loss)

    @property
    def right(self) -> bool:
        return self.loss_right and self.gradient_error < 1e-4

    def verdict(self) -> str | None:
        """None when right, else what differed from one device, in a sentence or two."""
        if self.right:
            return None
        size = sum(self.examples_per_replica)
        split = (f"split over {len(self.examples_per_replica)} replicas as "
                 f"{self.examples_per_replica}")
        gradient = (f"their summed gradient is {self.gradient_ratio:.4g}× one device's in norm "
                    f"(off by up to {self.gradient_error:.2g} of its largest element)")
        if self.loss_right:
            return (f"{split}, the replicas' losses add up to one device's loss "
                    f"({self.true_loss:.6g}), but {gradient}: a key's embedding is scored by "
                    "the queries of every replica, and the gradient of those scores must "
                    "reach the replica that embedded it")
        said = (f"{split}, the replicas' losses add up to {self.loss_sum:.6g}; one device's "
                f"loss of these {size} pairs is {self.true_loss:.6g} "
                f"({self.loss_sum / self.true_loss:.4g}×), and {gradient}")
        if abs(self.loss_sum - self.own_keys_loss) <= 1e-4 * abs(self.own_keys_loss):
            said += (f". That sum is the loss of each query scored against its own "
                     f"replica's keys only ({self.own_keys_loss:.6g}): one device scores it "
                     f"against all {size} keys of the global batch")
        return said


def measure_pairs(strategy: Any, model: Any, fn: Any, queries: Any, keys: Any,
                  split: tuple[int, ...] | None = None) -> PairMeasurement:
    """``fn(query_embeddings, key_embeddings)`` in every replica on its slice of the global
    batch of pairs (split as ``experimental_distribute_dataset`` splits it, or ``split``: the
    pairs of each replica, in order, as input pipelines of their own may split them), the
    model embedding both there; the summed losses and gradients against one device's. The
    weights are kept."""
    import numpy as np

    tf = _tf()
    if split is None:
        batch = next(iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensors((queries, keys)))))
    else:  # replica 0 may hold fewer than the others, or none (r02 L3, L4)
        at = np.cumsum((0, *split))
        batch = strategy.experimental_distribute_values_from_function(
            lambda context: tuple(tf.constant(part[at[context.replica_id_in_sync_group]:at[
                context.replica_id_in_sync_group + 1]]) for part in (queries, keys)))

    def replica_fn(query_features: Any, key_features: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = fn(model(query_features, training=True), model(key_features, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        gradients = [tf.zeros_like(v) if g is None else g  # a loss the weights do not reach
                     for g, v in zip(gradients, model.trainable_variables, strict=True)]
        return loss, gradients, tf.shape(query_features)[0]

    @tf.function
    def run(batch: Any) -> Any:
        loss, gradients, count = strategy.run(replica_fn, args=batch)
        total = tf.distribute.ReduceOp.SUM
        return (strategy.reduce(total, loss, axis=None),
                [strategy.reduce(total, g, axis=None) for g in gradients],
                strategy.experimental_local_results(count))

    with tf.GradientTape() as tape:
        true_loss = pair_loss(tf, model, (queries, keys))
    true_gradients = tape.gradient(true_loss, model.trainable_variables)
    loss, gradients, counts = run(batch)
    counts = tuple(int(c) for c in counts)
    largest = max(float(tf.reduce_max(tf.abs(t))) for t in true_gradients)
    error = max(float(tf.reduce_max(tf.abs(g - t)))
                for g, t in zip(gradients, true_gradients, strict=True))
    embedded_q = model(queries).numpy().astype(np.float64)
    embedded_k = model(keys).numpy().astype(np.float64)
    bounds = np.cumsum((0, *counts))
    own = sum(_losses(embedded_q[a:b], embedded_k[a:b]).sum()
              for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a) / len(queries)
    return PairMeasurement(
        examples_per_replica=counts, loss_sum=float(loss), true_loss=float(true_loss),
        own_keys_loss=float(own),
        gradient_ratio=float(tf.linalg.global_norm(gradients))
        / float(tf.linalg.global_norm(true_gradients)),
        gradient_error=error / largest)
