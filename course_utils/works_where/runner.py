"""Run the cells of one column (one strategy): each API's job, checked, errors caught."""

from __future__ import annotations

from typing import Any

from course_utils.works_where.cells import (
    APIS,
    FIRST_REPLICA_ONLY,
    NOT_APPLICABLE,
    OVERFLOW_NOT_PROBED,
    Cell,
    failed,
    not_applicable,
)
from course_utils.works_where.task import Task
from course_utils.works_where.verdicts import (
    TOLERANCES,
    check_async,
    check_distributed,
    check_same_as_reference,
)

__all__ = ["run_cell", "run_column"]


def _run_job(row: str, column: str, strategy: Any, task: Task, expected_replicas: int) -> Cell:
    if column == "parameter_server":
        from course_utils.works_where.coordinator_jobs import PS_JOBS, PS_STEPS

        weights, applied, iterations = PS_JOBS[row](strategy, task)
        cell = check_async(row, column, task, weights, applied, PS_STEPS, iterations)
        if row == "loss_scale_optimizer" and cell.status == "works":
            return _not_probed(cell)  # scheduled steps: no overflow step is run
        return cell
    if row == "keras_distribution":
        from course_utils.strategies import replica_devices
        from course_utils.works_where.jobs import (
            fit_keras_distribution,
            initialize_keras_distribution,
        )

        if column == "multi_worker":  # Keras's multi-process set-up, then every device
            devices = initialize_keras_distribution()
        else:
            devices = [name.split("device:")[-1].lower() for name in replica_devices()]
        weights, placed = fit_keras_distribution(task, devices)
        return check_distributed(row, column, task, weights, placed, devices)
    from course_utils.works_where.jobs import SYNC_JOBS

    weights = SYNC_JOBS[row](strategy, task)
    tolerance = TOLERANCES["mixed_float16" if row == "loss_scale_optimizer" else "float32"]
    cell = check_same_as_reference(row, column, task, weights, strategy.num_replicas_in_sync,
                                   expected_replicas, tolerance)
    if row == "loss_scale_optimizer" and cell.status == "works":
        if column == "multi_worker":  # see _overflow_caveat: only finite steps checked here
            return _not_probed(cell)
        cell = _overflow_caveat(cell, strategy, task)
    return cell


def _not_probed(cell: Cell) -> Cell:
    """A "works" LossScaleOptimizer cell whose overflow probe was not run (multi-worker,
    parameter servers): finite steps only, and the cell's caveat says so. An upstream issue
    the cell cited stays in its detail."""
    cited = f"; see also {cell.issue}" if cell.issue else ""
    return Cell(cell.status, cell.detail + "; the overflow probe was not run here (finite "
                f"steps only){cited}", OVERFLOW_NOT_PROBED)


def _overflow_caveat(cell: Cell, strategy: Any, task: Task) -> Cell:
    """Probe a "works" LossScaleOptimizer cell with an overflow on the last replica only: the
    cell stays "works" when that step was skipped, and becomes "wrong" when it was applied.

    Not under multi-worker: there each worker checks its own gradients, and a worker that
    skips while the other applies would put their gradients' all-reduces out of step.
    """
    from course_utils.works_where.jobs import overflow_on_last_replica_applied

    if not overflow_on_last_replica_applied(strategy, task):
        return Cell(cell.status, cell.detail + "; an overflow on the last replica was skipped",
                    cell.issue)
    # By the table's own rule ("it ran without an error but the check failed") this is ⚠️:
    # the weights matched the reference on finite steps, and an overflow broke them.
    return Cell("wrong", cell.detail + "; but an overflow on the last replica alone was "
                "applied (weights non-finite): finiteness is checked on the first replica only",
                FIRST_REPLICA_ONLY)


def run_cell(row: str, column: str, strategy: Any, task: Task, expected_replicas: int) -> Cell:
    """One combination: ``n/a`` with its reason, or the job run and checked, or its error."""
    if (row, column) in NOT_APPLICABLE:
        return not_applicable(row, column)
    try:
        return _run_job(row, column, strategy, task, expected_replicas)
    except Exception as error:  # noqa: BLE001 - the error is the result
        return failed(row, column, error)


def run_column(column: str, strategy: Any, task: Task, expected_replicas: int,
               rows: list[str] | None = None) -> dict[str, Cell]:
    """Every row (API) under one strategy: ``{row: Cell}``."""
    return {row: run_cell(row, column, strategy, task, expected_replicas)
            for row in (rows or list(APIS))}
