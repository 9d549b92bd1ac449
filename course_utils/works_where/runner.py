"""Run the cells of one column (one strategy): each API's job, checked, errors caught."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.works_where.cells import (
    APIS,
    FIRST_REPLICA_ONLY,
    KNOWN_ISSUES,
    NOT_APPLICABLE,
    OVERFLOW_NOT_PROBED,
    Cell,
    failed,
    first_line,
    not_applicable,
)
from course_utils.works_where.task import Task
from course_utils.works_where.verdicts import (
    check_async,
    check_distributed,
    check_loss_scaled,
    check_same_as_reference,
)

__all__ = ["run_cell", "run_column"]


def _run_job(row: str, column: str, strategy: Any, task: Task,
             expected_replicas: int) -> Callable[[], Cell]:
    """Run the row's job under the strategy (an error here is the API's) and return the check
    of what it returned (an error there is the check's: :func:`run_cell`)."""
    if column == "parameter_server":
        from course_utils.works_where.coordinator_jobs import PS_JOBS, PS_STEPS

        weights, applied, iterations, *skipped = PS_JOBS[row](strategy, task)

        def check_ps() -> Cell:
            cell = check_async(row, column, task, weights, applied, PS_STEPS, iterations,
                               sum(skipped))
            if row == "loss_scale_optimizer" and cell.status == "works":
                return _not_probed(cell)  # scheduled steps: no overflow step is run
            return cell
        return check_ps
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
        return lambda: check_distributed(row, column, task, weights, placed, devices)
    from course_utils.works_where.jobs import SYNC_JOBS, overflow_on_last_replica_applied

    replicas = strategy.num_replicas_in_sync
    if row != "loss_scale_optimizer":
        weights = SYNC_JOBS[row](strategy, task)
        return lambda: check_same_as_reference(row, column, task, weights, replicas,
                                               expected_replicas)
    weights, overflowed, skipped = SYNC_JOBS[row](strategy, task)
    # the overflow probe, not under multi-worker (see _overflow_caveat): an API run too
    applied = None if column == "multi_worker" else overflow_on_last_replica_applied(
        strategy, task)

    def check_loss_scale() -> Cell:
        cell = check_loss_scaled(row, column, task, weights, replicas, expected_replicas,
                                 overflowed, skipped)
        if cell.status != "works":
            return cell
        return _not_probed(cell) if applied is None else _overflow_caveat(cell, applied)
    return check_loss_scale


def _not_probed(cell: Cell) -> Cell:
    """A "works" LossScaleOptimizer cell whose overflow probe was not run (multi-worker,
    parameter servers): finite steps only, and the cell's caveat says so. An upstream issue
    the cell cited stays in its detail."""
    cited = f"; see also {cell.issue}" if cell.issue else ""
    return Cell(cell.status, cell.detail + "; the overflow probe was not run here (finite "
                f"steps only){cited}", OVERFLOW_NOT_PROBED)


def _overflow_caveat(cell: Cell, applied: bool) -> Cell:
    """A "works" LossScaleOptimizer cell after its probe, one step with an overflow on the last
    replica only (``jobs.overflow_on_last_replica_applied``): it stays "works" when that step
    was skipped, and becomes "wrong" when it was ``applied``.

    Not under multi-worker: there each worker checks its own gradients, and a worker that
    skips while the other applies would put their gradients' all-reduces out of step.
    """
    if not applied:
        return Cell(cell.status, cell.detail + "; an overflow on the last replica was skipped",
                    cell.issue)
    # By the table's own rule ("it ran without an error but the check failed") this is ⚠️:
    # the weights matched the reference on finite steps, and an overflow broke them.
    return Cell("wrong", cell.detail + "; but an overflow on the last replica alone was "
                "applied (weights non-finite): finiteness is checked on the first replica only",
                FIRST_REPLICA_ONLY)


def run_cell(row: str, column: str, strategy: Any, task: Task, expected_replicas: int) -> Cell:
    """One combination: ``n/a`` with its reason, or the job run and checked, or its error.

    An error of the job is the API's (❌, "fails"); an error of the check (say, weights in
    another structure than the reference's) is not: the run is then unchecked, so "wrong"
    (⚠️), with a detail that says the check raised."""
    if (row, column) in NOT_APPLICABLE:
        return not_applicable(row, column)
    try:
        check = _run_job(row, column, strategy, task, expected_replicas)
    except Exception as error:  # noqa: BLE001 - the error is the result
        return failed(row, column, error)
    try:
        return check()
    except Exception as error:  # noqa: BLE001 - the check's own error, not the API's
        return Cell("wrong", f"the job ran, but its check raised {first_line(error)}: "
                    "unchecked, so not ✅", _issue(row, column))


def _issue(row: str, column: str) -> str | None:
    return KNOWN_ISSUES.get((row, "mirrored" if column == "tpu" else column))


def run_column(column: str, strategy: Any, task: Task, expected_replicas: int,
               rows: list[str] | None = None) -> dict[str, Cell]:
    """Every row (API) under one strategy: ``{row: Cell}``."""
    return {row: run_cell(row, column, strategy, task, expected_replicas)
            for row in (rows or list(APIS))}
