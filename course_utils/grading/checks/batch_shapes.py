"""Batches of one epoch, what is wrong with their sizes or elements, an epoch timed, and the
steps of a pipeline's graph (lesson 01's checks)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["batches", "dataset_steps", "epoch_seconds", "expected_sizes", "multiset_problem",
           "size_problem"]


def batches(dataset: Any) -> list[np.ndarray]:
    """One epoch of ``dataset`` as NumPy arrays, one per batch."""
    return [np.asarray(batch) for batch in dataset.as_numpy_iterator()]


def epoch_seconds(dataset: Any) -> float:
    """Seconds one epoch of ``dataset`` takes to iterate."""
    start = time.perf_counter()
    for _ in dataset:
        pass
    return time.perf_counter() - start


def dataset_steps(dataset: Any) -> list[str]:
    """The kinds of tf.data steps in ``dataset``'s serialized graph ("CacheDatasetV2", ...),
    sorted; stateful steps (a py_function, a random generator) are serialized, not refused."""
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor, external_state_policy=1).numpy())
    return sorted({node.op for node in graph.node if "Dataset" in node.op})


def expected_sizes(num_elements: int, batch_size: int) -> list[int]:
    """The sizes of ``num_elements`` batched by ``batch_size`` (a short last batch kept)."""
    sizes = [batch_size] * (num_elements // batch_size)
    return sizes + ([num_elements % batch_size] if num_elements % batch_size else [])


def size_problem(batches: list[np.ndarray], num_elements: int, batch_size: int) -> str | None:
    """What is wrong with the batches' shapes or sizes, or None."""
    if any(batch.ndim != 1 for batch in batches):
        shapes = sorted({batch.shape for batch in batches})
        return (f"expected batches of scalars (shape [batch]), got shapes {shapes[:3]}: "
                "batch the elements once, with .batch(batch_size)")
    sizes = [len(batch) for batch in batches]
    expected = expected_sizes(num_elements, batch_size)
    if sorted(sizes) != sorted(expected):
        return (f"batch sizes differ: expected {len(expected)} batches of {batch_size}"
                f"{f' and one of {num_elements % batch_size}' if num_elements % batch_size else ''}"
                f", got sizes {sizes[:12]}{' ...' if len(sizes) > 12 else ''}")
    return None


def multiset_problem(got: np.ndarray, expected: np.ndarray) -> str | None:
    """How ``got``'s elements differ from ``expected``'s as a multiset, or None."""
    if len(got) != len(expected):
        return f"expected {len(expected)} elements in one epoch, got {len(got)}"
    got_sorted, want_sorted = np.sort(got), np.sort(expected)
    if not np.allclose(got_sorted, want_sorted):
        missing = sorted(set(want_sorted.tolist()) - set(got_sorted.tolist()))[:5]
        extra = sorted(set(got_sorted.tolist()) - set(want_sorted.tolist()))[:5]
        return (f"the elements differ from the slow pipeline's (as a multiset): missing e.g. "
                f"{missing}, unexpected e.g. {extra}")
    return None
