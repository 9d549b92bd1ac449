"""Turn what a job returned into a cell: "works" only when its correctness check passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from course_utils.equality import largest_difference
from course_utils.works_where.cells import ITERATIONS_SHORT, KNOWN_ISSUES, Cell
from course_utils.works_where.task import Task, task_loss

__all__ = ["TOLERANCES", "largest_difference", "check_same_as_reference", "check_async",
           "check_distributed", "check_loss_scaled"]

#: Largest weight difference from the one-device reference that still counts as equal:
#: float32 sums in another order, and float16 compute under ``mixed_float16``.
TOLERANCES = {"float32": 1e-5, "mixed_float16": 2e-3}


def _issue(row: str, column: str) -> str | None:
    return KNOWN_ISSUES.get((row, "mirrored" if column == "tpu" else column))


def _works(detail: str, caveat: str | None = None) -> Cell:
    """A "works" cell links only a caveat its detail states (never the row's known issue): a
    link beside ✅ says "read the details", so the details must hold what it is about."""
    return Cell("works", detail, caveat)


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
                            tolerance: float = TOLERANCES["float32"],
                            skipped: Sequence[int] = ()) -> Cell:
    """Works when the weights equal the one-device reference and the replica count is right
    (a reference that does not apply the steps in ``skipped``, when given)."""
    error = largest_difference(weights, task.reference_weights(skip=skipped))
    if replicas != expected_replicas:
        return Cell("wrong", f"trained on {replicas} replica(s), expected {expected_replicas}",
                    _issue(row, column))
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    if not error <= tolerance:
        return Cell("wrong", f"weights differ from the 1-device reference by {error:.1e} "
                    f"(> {tolerance:.0e})", _issue(row, column))
    return _works(f"{replicas} replica(s); weights = 1-device reference "
                  f"(max |Δw| {error:.0e})")


def check_loss_scaled(row: str, column: str, task: Task, weights: Sequence[Any],
                      replicas: int, expected_replicas: int, overflowed: Sequence[int],
                      skipped: Sequence[int]) -> Cell:
    """A ``LossScaleOptimizer`` must skip exactly the steps whose gradients overflowed (on any
    replica); its weights are then compared with a reference that skips those steps too."""
    if list(skipped) != list(overflowed):
        return Cell("wrong", f"the loss scale skipped step(s) {list(skipped) or 'none'}, but "
                    f"the gradients overflowed at step(s) {list(overflowed) or 'none'}",
                    _issue(row, column))
    cell = check_same_as_reference(row, column, task, weights, replicas, expected_replicas,
                                   TOLERANCES["mixed_float16"], skipped)
    if not skipped:
        return cell
    return Cell(cell.status, cell.detail + f"; step(s) {list(skipped)} overflowed and were "
                "skipped, as in the reference, which skips them too", cell.issue)


def check_async(row: str, column: str, task: Task, weights: Sequence[Any], applied: int,
                scheduled: int, optimizer_iterations: int | None = None,
                skipped: int = 0) -> Cell:
    """Asynchronous training works when every scheduled step was applied, or skipped by a loss
    scale for non-finite gradients (``skipped``), and the loss fell.

    ``optimizer_iterations`` (the optimizer's own count) is reported when it is short; then,
    and only then, a "works" cell links the caveat (:data:`cells.ITERATIONS_SHORT`).
    """
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    before, after = task_loss(task, task.initial_weights), task_loss(task, weights)
    summary = f"{applied}/{scheduled} steps applied"
    if skipped:  # no reference can skip the same steps: asynchronous, in no fixed order
        summary += (f", {skipped} skipped by the loss scale (non-finite gradients: it halved "
                    f"{skipped} time(s))")
    summary += f", loss {before:.2f} → {after:.2f}"
    short = optimizer_iterations is not None and optimizer_iterations != applied
    if short:
        summary += f"; optimizer.iterations counted {optimizer_iterations}"
    if applied + skipped != scheduled or not after < 0.8 * before:
        return Cell("wrong", summary, _issue(row, column))
    return _works(summary + " (asynchronous: no step-by-step reference)",
                  ITERATIONS_SHORT if short else None)


def check_distributed(row: str, column: str, task: Task, weights: Sequence[Any],
                      placed: Sequence[set[str]], devices: Sequence[str]) -> Cell:
    """Data parallelism works when the model trained correctly and each variable is replicated:
    ``placed`` holds, per variable, the devices with a copy of it (``jobs.variable_devices``:
    a ``MirroredVariable``'s components, a replicated DTensor layout's mesh), and each must
    include every device of the distribution. Variables spread one per device are not
    replicated. Only where the variables are held is measured, not how the batches were
    split."""
    error = largest_difference(weights, task.reference_weights())
    if (broken := _not_finite(row, column, weights)) is not None:
        return broken
    if not error <= TOLERANCES["float32"]:
        return Cell("wrong", f"weights differ from the reference by {error:.1e}",
                    _issue(row, column))
    from course_utils.works_where.jobs import device_name

    wanted = {device_name(device) for device in devices}
    held = [{device_name(device) for device in copies} for copies in placed]
    if not held or any(not wanted <= copies for copies in held):
        on = set().union(*held)
        where = (f"every variable is on {', '.join(sorted(on))}"
                 if all(copies == on for copies in held) else
                 f"{sum(not wanted <= copies for copies in held)} of {len(held)} variables "
                 f"lack a copy on some device (between them on {', '.join(sorted(on))})")
        return Cell("wrong", f"trained, but {where} of {len(devices)} devices: not replicated "
                    "(variable placement measured, not the data split; TF backend: a "
                    "prototype)", _issue(row, column))
    return _works(f"each variable replicated on all {len(wanted)} devices; weights = "
                  "reference")
