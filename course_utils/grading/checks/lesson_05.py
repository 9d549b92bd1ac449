"""Checks of lesson 05's exercises (registered by name with ``@register``).

* ``check_make_tpu_ready(make_tpu_ready)``: on fresh variable-length sequences, the pipeline's
  ``element_spec`` has every dimension known, a compiled step traces once over an epoch, the
  epoch has ``n // batch_size`` batches, and the batches hold the sequences cut or padded with
  zeros at the end to ``sequence_length``.
* ``check_tpu_settings(tpu_settings)``: the per-replica batch and ``steps_per_execution`` for
  fresh described TPUs, compared with the rules stated in the exercise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from course_utils.environment import import_tensorflow as _tf  # quiet, on first use
from course_utils.grading.checks.registry import register
from course_utils.grading.framework import Case, fresh_rng, run_check

__all__ = ["check_make_tpu_ready", "check_tpu_settings", "reference_tpu_settings"]


# --- Exercise 1 · a TPU-ready pipeline ---------------------------------------------------------


def _sequences(rng: Any, n: int, longest: int) -> tuple[list[np.ndarray], np.ndarray]:
    data = np.random.default_rng(rng.randint(0, 2**31 - 1))
    lengths = data.integers(1, longest + 1, size=n)
    tokens = [data.integers(1, 100, size=length).astype("int32") for length in lengths]
    return tokens, data.integers(0, 2, size=n).astype("int32")


def _raw_dataset(tokens: list[np.ndarray], labels: np.ndarray) -> Any:
    tf = _tf()
    return tf.data.Dataset.from_generator(
        lambda: zip(tokens, labels, strict=True),
        output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))


def _expected_batches(tokens: list[np.ndarray], labels: np.ndarray, batch: int,
                      length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    fixed = np.zeros((len(tokens), length), "int32")
    for row, sequence in enumerate(tokens):
        cut = sequence[:length]
        fixed[row, :len(cut)] = cut
    return [(fixed[i:i + batch], labels[i:i + batch])
            for i in range(0, len(tokens) - batch + 1, batch)]


def _verify_pipeline(dataset: Any, tokens: list[np.ndarray], labels: np.ndarray, batch: int,
                     length: int) -> str | None:
    tf = _tf()
    if not isinstance(dataset, tf.data.Dataset):
        return f"expected a tf.data.Dataset, got {type(dataset).__name__}"
    specs = tf.nest.flatten(dataset.element_spec)
    shapes = [tuple(spec.shape.as_list()) for spec in specs]
    if any(dim is None for shape in shapes for dim in shape):
        return (f"element_spec has unknown dimensions {shapes}: a TPU needs every dimension "
                "known (drop_remainder=True for the batch, a fixed length for the sequences)")
    if shapes != [(batch, length), (batch,)]:
        return f"element shapes are {shapes}, expected [({batch}, {length}), ({batch},)]"

    @tf.function(jit_compile=True)
    def step(x: Any, y: Any) -> Any:
        return tf.reduce_sum(tf.cast(x, tf.float32)) + tf.cast(tf.reduce_sum(y), tf.float32)

    got = []
    for x, y in dataset:
        step(x, y)
        got.append((x.numpy(), y.numpy()))
    traces = step.experimental_get_tracing_count()
    if traces != 1:
        return f"a compiled step traced {traces} times over one epoch, expected once"
    expected = _expected_batches(tokens, labels, batch, length)
    if len(got) != len(expected):
        return f"the epoch has {len(got)} batches, expected {len(expected)} (n // batch_size)"
    for number, ((x, y), (ex, ey)) in enumerate(zip(got, expected, strict=True), start=1):
        if not np.array_equal(y, ey):
            return f"batch {number}'s labels differ: keep the examples in order (no shuffle)"
        if not np.array_equal(x, ex):
            row = int(np.argmax(np.any(x != ex, axis=1)))
            return (f"batch {number}, row {row}: got {x[row].tolist()}, expected "
                    f"{ex[row].tolist()} (keep the first sequence_length tokens, pad with zeros "
                    "at the end)")
    return None


@register
def check_make_tpu_ready(fn: Any) -> bool:
    """Check ``make_tpu_ready(dataset, batch_size, sequence_length)`` on fresh sequences."""
    rng = fresh_rng()
    cases = []
    for _ in range(2):
        batch, length = rng.choice([4, 8, 16]), rng.choice([6, 10, 16])
        n = batch * rng.randint(3, 6) + rng.randint(1, batch - 1)  # a partial last batch
        tokens, labels = _sequences(rng, n, 2 * length)

        def verify(got: Any, tokens: Any = tokens, labels: Any = labels, batch: int = batch,
                   length: int = length) -> str | None:
            return _verify_pipeline(got, tokens, labels, batch, length)

        cases.append(Case(args=(_raw_dataset(tokens, labels), batch, length), verify=verify,
                          label=f"({n} sequences of 1 to {2 * length} tokens, batch_size={batch}, "
                                f"sequence_length={length})"))
    return run_check(
        "make_tpu_ready", fn, cases,
        hint="map each (tokens, label) to (tokens[:sequence_length] padded with zeros at the end "
             "to sequence_length, label), then batch(batch_size, drop_remainder=True); "
             "tf.ensure_shape or padded_batch(padded_shapes=...) make the length static "
             "(lesson 05, section 3).")


# --- Exercise 2 · settings for a described TPU --------------------------------------------------


def reference_tpu_settings(replicas: int, max_global_batch: int, host_overhead_ms: float,
                           step_ms: float, max_overhead_fraction: float,
                           num_examples: int) -> tuple[int, int]:
    """The exercise's rules: the per-replica batch and steps_per_execution."""
    largest = max_global_batch // replicas
    per_replica = largest // 128 * 128 or largest // 8 * 8
    steps_per_epoch = num_examples // (per_replica * replicas)
    needed = math.ceil(round(host_overhead_ms / (max_overhead_fraction * step_ms), 6))
    return per_replica, max(1, min(needed, steps_per_epoch))


@register
def check_tpu_settings(fn: Any) -> bool:
    """Check ``tpu_settings(replicas, max_global_batch, host_overhead_ms, step_ms,
    max_overhead_fraction, num_examples)`` on fresh described TPUs."""
    rng = fresh_rng()
    cases = [Case(args=(8, 4096, 2.0, 0.5, 0.1, 1_000_000)),  # a v5e-8, small fast steps
             Case(args=(1, 100, 1.0, 4.0, 0.05, 10_000))]  # Colab's v5e-1, a small batch
    for _ in range(4):
        replicas = rng.choice([1, 4, 8, 16])
        args = (replicas, replicas * rng.randint(16, 1200), rng.choice([0.5, 1.0, 2.0, 5.0]),
                rng.choice([0.2, 1.0, 3.0, 20.0]), rng.choice([0.02, 0.05, 0.1]),
                rng.randint(20_000, 2_000_000))
        cases.append(Case(args=args))
    cases.append(Case(args=(4, 4 * 256, 5.0, 0.1, 0.01, 4 * 256 * 3)))  # capped at the epoch
    for case in cases:
        case.expected = reference_tpu_settings(*case.args)
    return run_check(
        "tpu_settings", fn, cases,
        hint="per replica: the largest multiple of 128 with per_replica × replicas ≤ "
             "max_global_batch, else the largest multiple of 8; steps_per_execution: the "
             "smallest n with host_overhead_ms / n ≤ max_overhead_fraction × step_ms, at most "
             "the steps of one epoch (drop_remainder) and at least 1 (round the ratio to 6 "
             "decimals before math.ceil: floating point). Return a tuple "
             "(per_replica_batch, steps_per_execution) (lesson 05, sections 5 and 7).")
