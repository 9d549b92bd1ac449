"""Lesson 03 exercise 1: the worker's evaluation on a held-out set, and the one-device references.

Every worker's copy of the data (``data-{i}.npz``) holds, beside its training shard, the
held-out set ``x_eval``/``y_eval``: its own examples i, i + W, ... (W workers) real, the other
rows decoys drawn alike. The set's size leaves the workers unequal shards and some of them one
batch more than the others (:func:`held_out_data`), so that a fixed count of steps, a dropped
remainder or a mean of the workers' means gives another number than the mean over every
example. :func:`held_out_problem` reads what the check's set-up recorded in every worker (the
loss its ``train_worker`` returned; the examples each forward pass of the model carried after
the last backward pass, and which rows they were, each row's hidden units projected
(:func:`row_prints`), so that other rows of the right counts through the model are named: xf03
L2) and compares the loss with :func:`held_out_loss`, the mean on one
device in float64. Also here: how the workers built their models (:func:`build_problem`), the
one-device training (:func:`reference_weights`) and what the optimizer saved
(:func:`optimizer_problem`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.grading.checks.worker_scripts import LEARNING_RATE

__all__ = [
    "build_problem",
    "failed_build",
    "held_out_data",
    "held_out_loss",
    "held_out_problem",
    "optimizer_problem",
    "reference_weights",
    "row_prints",
]


def build_problem(builds: dict[int, list[dict[str, Any]]], workers: int) -> str | None:
    """What is wrong with how the workers built their models (``builds[i]``: worker i's calls
    of ``build_model``, as it recorded them), or None."""
    for worker, built in sorted(builds.items()):
        if len(built) != 1:
            return (f"worker {worker} called build_model {len(built)} times: build the model "
                    "once, inside the strategy's scope")
        if not built[0]["multi_worker"]:
            return (f"worker {worker} built the model under {built[0]['strategy']}, not in the "
                    "scope of a tf.distribute.MultiWorkerMirroredStrategy")
        if built[0]["replicas"] != workers:
            return (f"worker {worker}'s strategy had {built[0]['replicas']} replicas in sync, "
                    f"not {workers}: was TF_CONFIG read (the strategy built first)?")
    return None


def failed_build(out: Path, workers: int) -> str | None:
    """In a job that failed: what the builds its workers recorded already show, or None."""
    builds = {}
    for worker in range(workers):
        try:
            builds[worker] = json.loads((out / f"built-{worker}.json").read_text())
        except (OSError, ValueError):    # it failed before building, or while writing
            pass
    return build_problem(builds, workers)


def held_out_data(data: np.random.Generator, workers: int, replica_batch: int,
                  features: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A held-out set of W·b·m + r examples (1 <= r < W): workers 0 … r-1 hold one more
    example than the others, in one more (partial) batch of ``replica_batch``."""
    size = workers * replica_batch * int(data.integers(1, 3)) + int(data.integers(1, workers))
    x = data.normal(size=(size, features)).astype("float32")
    return x, data.integers(0, classes, size=size).astype("int32")


def _hidden(x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    """The rows the audit layer sees: Dense(8, relu) of ``x`` under ``weights``, in float64."""
    kernel, bias = (np.asarray(w, "float64") for w in weights[:2])
    return np.maximum(np.asarray(x, "float64") @ kernel + bias, 0.0)


def row_prints(x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    """Each row of ``x`` as SETUP's audit records it in a forward pass: its hidden units
    projected on sqrt(1 … 8), sorted (so that passes in any order compare)."""
    hidden = _hidden(x, weights)
    return np.sort(hidden @ np.sqrt(np.arange(1.0, hidden.shape[1] + 1)))


def held_out_loss(job: dict[str, Any], weights: list[np.ndarray]) -> np.ndarray:
    """Each held-out example's cross-entropy under ``weights`` (the exercise's model: Dense(8,
    relu), the audit's identity, Dense(classes)) on one device, in float64."""
    out_kernel, out_bias = (np.asarray(w, "float64") for w in weights[2:])
    logits = _hidden(job["x_eval"], weights) @ out_kernel + out_bias
    top = logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return log_norm - logits[np.arange(len(logits)), job["y_eval"]]


def held_out_problem(job: dict[str, Any], audits: list[dict[str, Any]],
                     weights: list[np.ndarray]) -> str | None:
    """What is wrong with the held-out losses the workers returned (None when right)."""
    workers, steps = job["workers"], job["steps"]
    batch, size = job["global_batch"] // workers, len(job["x_eval"])
    for worker, audit in enumerate(audits):
        if audit.get("held_out") is None:
            return (f"worker {worker}'s train_worker returned a {audit.get('returned')}, not "
                    "(weights, held-out loss): return model.get_weights() and the mean loss "
                    "over the held-out set, a number")
    for worker, audit in enumerate(audits):
        own = len(range(worker, size, workers))
        passes = [rows for rows, after, _ in audit["forward"] if after == steps and rows]
        if sum(passes) != own or any(rows > batch for rows in passes):
            padded = " (rows added to fill a batch count too)" if sum(passes) > own else ""
            return (f"worker {worker} of {workers} ran {sum(passes)} held-out examples through "
                    f"the trained model, in passes of {passes[:6]}; its copy holds {own} of the "
                    f"{size} (examples {worker}, {worker + workers}, …, the others decoys): "
                    "evaluate each of its own once, after the last step, in batches of at most "
                    f"replica_batch ({batch}): no repeat, no drop_remainder, no fixed count of "
                    f"steps (the workers' shards differ){padded}")
    for worker, audit in enumerate(audits):     # the rows themselves (xf03 L2)
        ran = np.sort([v for rows, after, prints in audit["forward"] if after == steps
                       for v in prints])
        own = row_prints(job["x_eval"][worker::workers], weights)
        if not np.allclose(ran, own, rtol=1e-4, atol=1e-4):
            return (f"worker {worker} of {workers} ran {len(ran)} rows through the trained "
                    "model after the last step, but not its own held-out examples (what the "
                    "model's hidden layer saw differs from examples "
                    f"{worker}, {worker + workers}, … under the final weights): evaluate the "
                    "trained model on its own examples, not on other rows")
    values = [float(audit["held_out"]) for audit in audits]
    if not np.isfinite(values).all() or np.ptp(values) > 1e-6 * max(1.0, abs(values[0])):
        return (f"the workers returned different held-out losses {values}: each evaluated only "
                "its own examples; all-reduce the sums of the losses and the counts of the "
                "examples across the workers, and divide once")
    losses = held_out_loss(job, weights)
    expected = float(losses.mean())
    if abs(values[0] - expected) <= 1e-5 * max(1.0, abs(expected)):
        return None
    steps_run = -(-size // job["global_batch"])
    mistakes = {
        "the mean of the workers' own means (their shards differ in size)":
            np.mean([losses[worker::workers].mean() for worker in range(workers)]),
        "each step's loss over the global batch (compute_average_loss) averaged over the "
        "steps: the last, partial step counted as a full one":
            losses.sum() / job["global_batch"] / steps_run,
        "each step's loss over the global batch summed over the steps":
            losses.sum() / job["global_batch"],
    }
    named = [name for name, value in mistakes.items()
             if abs(values[0] - value) <= 1e-5 * max(1.0, abs(value))]
    return (f"the workers returned a held-out loss of {values[0]:.6g}; the mean over the "
            f"{size} held-out examples, with the final weights on one device, is "
            f"{expected:.6g}" + (f": you returned {named[0]}" if named else "")
            + ". Sum the per-example losses and count the examples in every worker, "
            "all-reduce both, divide once")


def reference_weights(job: dict[str, Any], steps: int, *, checkpoint: str | None = None,
                      initial: list[np.ndarray] | None = None,
                      batches: list[tuple[int, int]] | None = None) -> list[np.ndarray]:
    """One device: ``steps`` SGD steps on global batch k = examples [k·B, (k+1)·B) of the data
    repeated, from ``initial`` weights (or the steps ``batches`` lists, each (first example,
    size)); or, with ``checkpoint``, the model it holds."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    import keras

    x, y = job["x"], job["y"]
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Identity(),      # where SETUP's audit layer is
                              keras.layers.Dense(job["classes"])])
    if checkpoint is not None:
        tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
        return model.get_weights()
    if initial is None:
        raise ValueError("pass the initial weights (or a checkpoint)")
    model.set_weights(initial)
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if batches is None:
        batches = [(step * job["global_batch"], job["global_batch"]) for step in range(steps)]
    for first, batch in batches:
        rows = (first + np.arange(batch)) % len(x)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], model(x[rows]))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return model.get_weights()


def optimizer_problem(checkpoint: str, steps: int) -> str | None:
    """What the optimizer saved in ``checkpoint`` says is wrong: it applied fewer or more than
    ``steps`` steps, or its learning rate is not ``LEARNING_RATE`` (a per-replica mean loss
    with the rate divided by the replicas gives plain SGD the same weights, but not the
    optimizer the exercise asks for: with momentum, Adam or a schedule it trains otherwise)."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    reader = tf.train.load_checkpoint(checkpoint)
    names = [name for name, _ in tf.train.list_variables(checkpoint)]
    counts = [int(reader.get_tensor(n)) for n in names
              if n.endswith("iterations/.ATTRIBUTES/VARIABLE_VALUE")]
    if counts != [steps]:
        return ("the newest checkpoint holds no optimizer that applied every step: put the "
                "optimizer in the tf.train.Checkpoint with the model, so a restart resumes it")
    rates = [float(reader.get_tensor(n)) for n in names
             if n.endswith("_learning_rate/.ATTRIBUTES/VARIABLE_VALUE")]
    if len(rates) != 1 or not np.isclose(rates[0], LEARNING_RATE):
        return (f"the optimizer in the newest checkpoint has learning rate {rates}, not the "
                f"learning_rate given ({LEARNING_RATE}): keep SGD(learning_rate) and average "
                "the loss over the global batch (tf.nn.compute_average_loss), as the lesson does")
    return None
