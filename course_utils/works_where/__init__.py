"""What works where: every data-parallel training API of the course under every strategy.

One job per module:

* ``cells`` -- the rows (APIs), columns (strategies), :class:`Cell` results, upstream issues;
* ``task`` -- the small job's data, initial weights and one-device reference;
* ``jobs`` -- each API's job under a synchronous strategy (one device, mirrored, multi-worker);
* ``coordinator_jobs`` -- the jobs scheduled with a ``ClusterCoordinator``;
* ``verdicts`` -- "works" only when a correctness check passes;
* ``runner`` -- a column's cells, errors caught and reported;
* ``worker`` -- the script each multi-worker process runs;
* ``ps_process`` -- the script of the parameter-server column's process;
* ``matrix`` -- the whole table (local columns here, the clusters in subprocesses);
* ``table`` -- the Markdown file and README section, read back to compare runs;
* ``cli`` -- ``python -m course_utils works-where [--write | --check]``.

Importing this package does not import TensorFlow; the jobs import it when they run.
"""

from __future__ import annotations

from course_utils.works_where.cells import APIS, STATUSES, STRATEGIES, Cell, first_line
from course_utils.works_where.cli import TABLE_PATH, committed_table_path, table_document
from course_utils.works_where.jobs import keras_distribution_source
from course_utils.works_where.matrix import (
    LOCAL_COLUMNS,
    collect_multi_worker,
    collect_parameter_server,
    local_strategy,
    run_matrix,
    start_multi_worker,
    start_parameter_server,
    task_arguments,
    versions,
)
from course_utils.works_where.runner import run_cell, run_column
from course_utils.works_where.table import (
    Matrix,
    detail_rows,
    status_differences,
    status_rows,
    statuses_from_markdown,
    to_markdown,
)
from course_utils.works_where.task import Task, make_task, task_loss
from course_utils.works_where.verdicts import TOLERANCES, check_same_as_reference

__all__ = [
    "APIS",
    "LOCAL_COLUMNS",
    "STATUSES",
    "STRATEGIES",
    "TABLE_PATH",
    "TOLERANCES",
    "Cell",
    "Matrix",
    "Task",
    "check_same_as_reference",
    "collect_multi_worker",
    "collect_parameter_server",
    "committed_table_path",
    "detail_rows",
    "first_line",
    "keras_distribution_source",
    "local_strategy",
    "make_task",
    "run_cell",
    "run_column",
    "run_matrix",
    "start_multi_worker",
    "start_parameter_server",
    "status_differences",
    "status_rows",
    "statuses_from_markdown",
    "table_document",
    "task_arguments",
    "task_loss",
    "to_markdown",
    "versions",
]
