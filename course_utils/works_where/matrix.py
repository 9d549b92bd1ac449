"""Run the whole table: the local strategies in this process, multi-worker in 2 subprocesses,
parameter servers in one more.

The process needs 2 logical CPU devices (``cu.setup(logical_devices=2)`` before TensorFlow
starts). The multi-worker cluster is started first and works while this process runs the local
columns; :func:`collect_multi_worker` waits for it, reads its reports and checks that it left
no process and no port behind. The parameter-server column's in-process cluster cannot be
stopped, so it lives in a child process (``ps_process.py``) that takes it along when it exits;
:func:`collect_parameter_server` checks the same.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.works_where.cells import APIS, STRATEGIES, Cell
from course_utils.works_where.runner import run_column
from course_utils.works_where.table import Matrix
from course_utils.works_where.task import Task, make_task

__all__ = ["LOCAL_COLUMNS", "PS_REPORT_NAME", "versions", "local_strategy", "task_arguments",
           "start_multi_worker", "collect_multi_worker", "start_parameter_server",
           "collect_parameter_server", "run_matrix"]

#: The file the parameter-server child (``ps_process.py``) writes its cells to.
PS_REPORT_NAME = "report-ps.json"

#: The columns this process runs itself. Multi-worker and parameter servers run in child
#: processes: a ParameterServerStrategy connects its process to the cluster for good (no
#: MirroredStrategy can be created after it, and its servers cannot be stopped).
LOCAL_COLUMNS = ("default", "one_device", "mirrored", "tpu")


def versions() -> dict[str, str]:
    """The versions of TensorFlow, Keras and tf_keras the table was made with."""
    from importlib.metadata import version

    return {name: version(package) for name, package in
            (("TensorFlow", "tensorflow"), ("Keras", "keras"), ("tf_keras", "tf-keras"))}


def local_strategy(column: str) -> tuple[Any, int, str | None]:
    """``(strategy, expected replicas, note)`` for a column this process runs.

    The expected count is not read from the strategy (the check compares the strategy's
    ``num_replicas_in_sync`` with it): 1 for default and OneDevice; every logical GPU, else
    every logical CPU, of this process for Mirrored and the TPU fallback; every TPU core for
    a real TPU."""
    import tensorflow as tf

    from course_utils.strategies import make_strategy, replica_devices

    if column == "parameter_server":
        import gc

        from course_utils.cluster import start_in_process_cluster

        # Free the earlier columns' functions first: freed after this process joins the
        # cluster, each would be "removed" from every server, which logs one gRPC error each.
        gc.collect()

        cluster = start_in_process_cluster(num_workers=2, num_ps=1)
        return cluster.strategy(), 0, "an in-process cluster of 2 workers and 1 parameter server"
    if column == "tpu":
        strategy = make_strategy("tpu", verbose=False)
        if isinstance(strategy, tf.distribute.TPUStrategy):
            return strategy, len(tf.config.list_logical_devices("TPU")), "a real TPU"
        return (strategy, len(replica_devices()),
                f"no TPU here: `cu.make_strategy('tpu')` fell back to "
                f"{type(strategy).__name__} over {strategy.num_replicas_in_sync} device(s)")
    strategy = make_strategy(column, verbose=False)
    if column == "mirrored":
        devices = strategy.extended.worker_devices
        names = ", ".join(device.rsplit("/device:", 1)[-1] for device in devices)
        return (strategy, len(replica_devices()),
                f"MirroredStrategy over {len(devices)} device(s): {names}")
    return strategy, 1, None


def task_arguments(task: Task | None = None) -> list[str]:
    """The command-line arguments that make a child process's ``make_task`` build ``task``:
    ``--steps`` and ``--global-batch``. A task those two cannot rebuild (other layer sizes or
    another seed) is refused: the child would train something else."""
    task = task or make_task()
    rebuilt = make_task(steps=task.steps, global_batch=task.global_batch)
    pairs = [(rebuilt.x, task.x), (rebuilt.y, task.y),
             *zip(rebuilt.initial_weights, task.initial_weights, strict=True)]
    if not all(a.shape == b.shape and np.array_equal(a, b) for a, b in pairs):
        raise ValueError("the clusters' processes rebuild the task from its steps and global "
                         "batch only: make it with make_task(steps=..., global_batch=...)")
    return ["--steps", str(task.steps), "--global-batch", str(task.global_batch)]


def start_multi_worker(out_dir: str | Path, timeout: float = 150.0,
                       task: Task | None = None) -> Any:
    """Start 2 worker processes that run every API under MultiWorkerMirroredStrategy, on a
    task of ``task``'s sizes (default: ``make_task()``)."""
    from course_utils.cluster import LocalCluster

    return LocalCluster(module="course_utils.works_where.worker", num_workers=2,
                        args=["--out", str(out_dir), *task_arguments(task)],
                        timeout=timeout, stream=False)


def collect_multi_worker(cluster: Any, out_dir: str | Path) -> dict[str, Cell]:
    """Wait for the workers, stop the cluster, check nothing is left, return worker 0's cells.

    Raises RuntimeError when the two workers disagree or a process or port is left behind.
    """
    from course_utils.cluster import leftovers

    with cluster:
        cluster.wait()
    left = leftovers(cluster.pids, cluster.ports)
    if left != {"processes": [], "ports": []}:
        raise RuntimeError(f"the multi-worker cluster left {left} behind")
    reports = [json.loads((Path(out_dir) / f"report-{i}.json").read_text()) for i in range(2)]
    if [{row: cell["status"] for row, cell in r.items()} for r in reports].count(
            {row: cell["status"] for row, cell in reports[0].items()}) != 2:
        raise RuntimeError(f"the workers disagree: {reports}")
    return {row: Cell(**cell) for row, cell in reports[0].items()}


def start_parameter_server(out_dir: str | Path, timeout: float = 150.0,
                           task: Task | None = None) -> Any:
    """Start the child process that runs every API under ParameterServerStrategy (on an
    in-process cluster of its own: 2 workers, 1 parameter server), on a task of ``task``'s
    sizes (default: ``make_task()``)."""
    from course_utils.cluster import LocalCluster

    return LocalCluster(module="course_utils.works_where.ps_process", num_workers=1,
                        args=["--out", str(out_dir), *task_arguments(task)],
                        timeout=timeout, stream=False)


def collect_parameter_server(process: Any, out_dir: str | Path
                             ) -> tuple[dict[str, Cell], str, list[int]]:
    """Wait for the child, check that it left no process and no port of its cluster behind;
    return ``(cells, note, ports)``, ``ports`` those of its servers.

    Raises RuntimeError when something is left behind.
    """
    from course_utils.cluster import leftovers

    with process:
        process.wait()
    report = json.loads((Path(out_dir) / PS_REPORT_NAME).read_text())
    left = leftovers(process.pids, report["ports"])
    if left != {"processes": [], "ports": []}:
        raise RuntimeError(f"the parameter-server process left {left} behind")
    cells = {row: Cell(**cell) for row, cell in report["cells"].items()}
    return cells, report["note"], [int(port) for port in report["ports"]]


def run_matrix(task: Task | None = None, timeout: float = 150.0) -> Matrix:
    """Every API under every strategy, each cell a real job with its check (about a minute);
    the clusters' processes rebuild the same task (``task_arguments``), each cluster stopped after
    ``timeout`` seconds at most and checked to leave nothing behind."""
    task = task or make_task()
    cells: dict[str, dict[str, Cell]] = {row: {} for row in APIS}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        cluster = start_multi_worker(out_dir, timeout=timeout, task=task)
        servers = None
        try:
            for column in LOCAL_COLUMNS:
                strategy, replicas, note = local_strategy(column)
                if note:
                    notes[column] = note
                for row, cell in run_column(column, strategy, task, replicas).items():
                    cells[row][column] = cell
            servers = start_parameter_server(out_dir, timeout=timeout, task=task)
            for row, cell in collect_multi_worker(cluster, out_dir).items():
                cells[row]["multi_worker"] = cell
            ps_cells, notes["parameter_server"], _ = collect_parameter_server(servers, out_dir)
            for row, cell in ps_cells.items():
                cells[row]["parameter_server"] = cell
        finally:
            cluster.cleanup()
            if servers is not None:
                servers.cleanup()
    notes["multi_worker"] = "2 worker processes on localhost (`cu.cluster.LocalCluster`)"
    ordered = {row: {column: cells[row][column] for column in STRATEGIES} for row in APIS}
    return Matrix(ordered, versions(), {c: notes[c] for c in STRATEGIES if c in notes})
