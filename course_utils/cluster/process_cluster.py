"""A parameter-server cluster of real processes on localhost: one per worker and ps, killable.

Unlike the in-process servers of ``in_process``, every task here is its own process (running
``serve_task.py``), so one can be killed as a machine failure would kill it, and all of them are
stopped at the end: SIGKILL to each process group, also when the interpreter exits, and (Linux)
when the process that started them dies. This process is the coordinator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .errors import ClusterTimeoutError
from .logs import remove_log_dir, temporary_log_dir
from .processes import (
    death_signal_setter,
    describe_exit,
    forget_at_exit,
    start_worker,
    stop_at_exit,
    stop_processes,
)
from .tf_config import WORKER_ENV, cluster_spec, tf_config
from .waiting import poll_until

__all__ = ["ProcessCluster"]

_SERVE_TASK = str(Path(__file__).with_name("serve_task.py"))


class ProcessCluster:
    """Workers and parameter servers as separate processes on localhost (gRPC), for
    ``ParameterServerStrategy``; use it as a context manager so every process is stopped."""

    def __init__(self, num_workers: int = 2, num_ps: int = 1, *, start: bool = True) -> None:
        if num_workers < 1 or num_ps < 1:
            raise ValueError("a parameter-server cluster needs at least one worker and one ps")
        self.num_workers, self.num_ps = num_workers, num_ps
        self.cluster: dict[str, list[str]] = {}
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}
        self.log_dir: Path | None = None
        self._logs: list[Any] = []
        self._strategy: Any = None
        if start:
            self.start()

    @property
    def tasks(self) -> list[tuple[str, int]]:
        """Every task as ``(job, index)``: the parameter servers, then the workers."""
        return [("ps", i) for i in range(self.num_ps)] + [
            ("worker", i) for i in range(self.num_workers)
        ]

    def port(self, job: str, index: int) -> int:
        """The TCP port task ``job:index`` serves on."""
        return int(self.cluster[job][index].rsplit(":", 1)[1])

    @property
    def ports(self) -> list[int]:
        """The ports of every task (ps first)."""
        return [self.port(job, index) for job, index in self.tasks]

    @property
    def pids(self) -> list[int]:
        """The process ids of every task (ps first)."""
        return [self.processes[task].pid for task in self.tasks if task in self.processes]

    def start(self) -> ProcessCluster:
        """Pick free ports, start one process per task; returns at once (see ``wait_serving``)."""
        if self.processes:
            raise RuntimeError("the cluster is already started; stop() it first")
        spec = cluster_spec(self.num_workers, self.num_ps)
        self.cluster = {"ps": spec["ps"], "worker": spec["worker"]}
        self.log_dir = temporary_log_dir("cu_ps_cluster_")
        stop_at_exit(self)
        preexec = death_signal_setter()
        try:
            for job, index in self.tasks:
                env = dict(os.environ, **WORKER_ENV)
                env["CUDA_VISIBLE_DEVICES"] = ""  # servers of variables and CPU workers (04)
                env["TF_CONFIG"] = json.dumps(tf_config(self.cluster, job, index))
                path = self.log_dir / f"{job}-{index}.log"
                process, log = start_worker([sys.executable, _SERVE_TASK], env, path, preexec)
                self.processes[(job, index)] = process
                self._logs.append(log)
        except BaseException:
            self.stop()
            raise
        return self

    def log(self, job: str, index: int) -> str:
        """Everything task ``job:index`` has printed so far."""
        assert self.log_dir is not None, "the cluster has not been started"
        path = self.log_dir / f"{job}-{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_serving(self, timeout: float = 120.0) -> float:
        """Wait until every task prints that it serves; the seconds waited.

        Raises :class:`ClusterTimeoutError` (and stops the cluster) when a task exits or
        ``timeout`` passes first; Ctrl-C stops the cluster too.
        """
        start = time.monotonic()

        def waiting() -> list[tuple[str, int]]:
            return [t for t in self.tasks if "serving" not in self.log(*t)]

        def step() -> float | None:
            left = waiting()
            if not left:
                return time.monotonic() - start
            for t in left:
                code = self.processes[t].poll()
                if code is not None:
                    raise self._not_serving(f"task {t} ended ({describe_exit(code)})", left)
            return None

        def timed_out() -> ClusterTimeoutError:
            left = waiting()
            return self._not_serving(f"tasks {left} did not serve within {timeout:.0f} s", left)

        return poll_until(step, timeout, timed_out, self.stop, poll_interval=0.05)

    def _not_serving(self, what: str, tasks: list[tuple[str, int]]) -> ClusterTimeoutError:
        tails = "\n".join(f"{job}:{i}: {self.log(job, i)[-500:]}" for job, i in tasks)
        return ClusterTimeoutError(f"{what}; cluster stopped. Last lines:\n{tails}")

    def strategy(self) -> Any:
        """The ``ParameterServerStrategy`` of this cluster (made once); this process coordinates."""
        import tensorflow as tf

        if self._strategy is None:
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(self.cluster), rpc_layer="grpc"
            )
            self._strategy = tf.distribute.ParameterServerStrategy(resolver)
        return self._strategy

    def kill(self, job: str, index: int) -> int | None:
        """SIGKILL task ``job:index`` (a machine failure); its exit code once it is gone."""
        process = self.processes[(job, index)]
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return process.wait()

    def stop(self, grace: float = 0.0) -> dict[str, int | None]:
        """Stop every task (SIGTERM, ``grace`` seconds, SIGKILL); ``{"job:i": exit code}``."""
        codes = stop_processes(list(self.processes.values()), grace)
        for log in self._logs:
            log.close()
        self._logs = []
        forget_at_exit(self)
        return {f"{job}:{i}": code for (job, i), code in zip(self.processes, codes, strict=True)}

    def cleanup(self) -> None:
        """Stop every task and delete the log folder."""
        self.stop()
        if self.log_dir is not None:
            remove_log_dir(self.log_dir)

    def __enter__(self) -> ProcessCluster:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        alive = sum(p.poll() is None for p in self.processes.values())
        size = f"num_workers={self.num_workers}, num_ps={self.num_ps}"
        return f"ProcessCluster({size}, {alive} alive)"
