"""Turn what a job returned into a cell: "works" only when its correctness check passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.works_where.cells import KNOWN_ISSUES, Cell
from course_utils.works_where.task import Task, task_loss

__all__ = ["TOLERANCES", "largest_difference", "check_same_as_reference", "check_async",
           "check_distributed"]

#: Largest weight difference from the one-device reference that still counts as equal:
#: float32 sums in another order, and float16 compute under ``mixed_float16``.
TOLERANCES = {"float32": 1e-5, "mixed_float16": 2e-3}


def _issue(row: str, column: str) -> str | None:
    return KNOWN_ISSUES.get((row, "mirrored" if column == "tpu" else column))


def _not_finite(row: str, column: str, weights: Sequence[Any]) -> Cell | None:
    """The "wrong" cell of weights with a NaN or an inf (never "works"), else None."""
    arrays = [np.asarray(w, np.float64) for w in weights]
    nan = sum(int(np.isnan(a).sum()) for a in arrays)
    inf = sum(int(np.isinf(a).sum()) for a in arrays)
    if not nan and not inf:
        return None
    return Cell("wrong", f"weights not finite ({nan} NaN, {inf} inf): a non-finite result "
                "never counts as working", _issue(row, column))


def check_same_as_reference(row: str, column: str, task: Task, weights: Sequence[Any],
                            replicas: int, expected_replicas: int,
                            tolerance: float = TOLERANCES["float32"]) -> Cell:
    """Works when the weights equal the one-device reference and the replica count is right."""
    error = largest_difference(weights, task.reference_weights())
    if replicas != expected_replicas:
        return Cell("wrong", f"trained on {replicas} replica(s), expected {expected_replicas}",
                    _issue(row, column))
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    if not error <= tolerance:
        return Cell("wrong", f"weights differ from the 1-device reference by {error:.1e} "
                    f"(> {tolerance:.0e})", _issue(row, column))
    return Cell("works", f"{replicas} replica(s); weights = 1-device reference "
                f"(max |Δw| {error:.0e})", _issue(row, column))


def check_async(row: str, column: str, task: Task, weights: Sequence[Any], applied: int,
                scheduled: int, optimizer_iterations: int | None = None) -> Cell:
    """Asynchronous training works when every scheduled step was applied and the loss fell.

    ``optimizer_iterations`` (the optimizer's own count) is reported when it is short.
    """
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    before, after = task_loss(task, task.initial_weights), task_loss(task, weights)
    summary = f"{applied}/{scheduled} steps applied, loss {before:.2f} → {after:.2f}"
    if optimizer_iterations is not None and optimizer_iterations != applied:
        summary += f"; optimizer.iterations counted {optimizer_iterations}"
    if applied != scheduled or not after < 0.8 * before:
        return Cell("wrong", summary, _issue(row, column))
    return Cell("works", summary + " (asynchronous: no step-by-step reference)",
                _issue(row, column))


def check_distributed(row: str, column: str, task: Task, weights: Sequence[Any],
                      placed: set[str], devices: Sequence[str]) -> Cell:
    """Data parallelism works when the model trained correctly and its variables are on every
    device of the distribution (replicated), not on one. Only where the variables are placed
    is measured, not how the batches were split."""
    error = largest_difference(weights, task.reference_weights())
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    if not error <= TOLERANCES["float32"]:
        return Cell("wrong", f"weights differ from the reference by {error:.1e}",
                    _issue(row, column))
    if len(placed) < len(devices):
        return Cell("wrong", f"trained, but every variable is on {', '.join(sorted(placed))} "
                    f"of {len(devices)} devices: not replicated (variable placement measured, "
                    "not the data split; TF backend: a prototype)", _issue(row, column))
    return Cell("works", f"variables on {len(placed)} devices; weights = reference",
                _issue(row, column))
