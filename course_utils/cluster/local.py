"""A multi-worker cluster on localhost: start, wait, logs, time-outs, fault injection, clean-up.

:class:`LocalCluster` starts one subprocess per worker, each running your script with its own
``TF_CONFIG`` (free ports picked with portpicker), keeps a log file per worker and streams it,
and always cleans up (context manager, ``atexit``, Ctrl-C): SIGTERM, then SIGKILL, because hung
TensorFlow workers ignore SIGTERM. A failed or hung worker becomes a :class:`WorkerError` or
:class:`ClusterTimeoutError` carrying its last log lines, never a hung notebook. Each start makes
the :class:`~course_utils.cluster.waiting.WorkerWaiter` that its ``wait*`` methods hand over to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .kubernetes import tfjob_manifest
from .logs import WorkerLogs, remove_log_dir, temporary_log_dir
from .processes import (
    death_signal_setter,
    forget_at_exit,
    start_worker,
    stop_at_exit,
    stop_processes,
)
from .tf_config import (
    COLLECTIVE_TIMEOUT_ENV,
    WORKER_ENV,
    cluster_spec,
    tf_config,
    visible_gpus,
    worker_gpus,
)
from .waiting import WorkerWaiter

__all__ = ["LocalCluster"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class LocalCluster:
    """A multi-worker cluster on localhost: one subprocess per worker, each running ``script``.

    Args:
        script: the Python file every worker runs (``sys.executable script *args``).
        module: instead of ``script``, a module every worker runs as ``python -m module *args``
            (a script of the package runs as a module, so it needs no ``sys.path`` set-up).
        num_workers: number of workers (task type ``worker``, index 0 is the chief).
        args: extra command-line arguments for the script.
        timeout: seconds :meth:`wait` waits for all workers before raising
            :class:`ClusterTimeoutError` (and stopping them).
        collective_timeout: seconds passed to the workers' ``CommunicationOptions`` through
            ``COURSE_COLLECTIVE_TIMEOUT`` (read by ``worker_strategy``); default ``timeout``.
        env: extra environment variables for every worker.
        log_dir: where ``worker-<i>.log`` files go (default: a new temporary directory, kept
            while the interpreter runs so the logs can be read after the cluster stops, and
            deleted when it exits or on :meth:`cleanup`).
        stream: print new log lines, prefixed ``[worker i]``, while waiting.
        start: start the workers at once (else call :meth:`start`).
        grace: seconds between SIGTERM and SIGKILL when stopping (measured: a TensorFlow
            multi-worker process did not exit on SIGTERM, so waiting longer buys nothing).
        start_timeout: when set, :meth:`wait` and :meth:`wait_for` raise
            :class:`ClusterTimeoutError` if some worker's server is not listening on its port
            this many seconds after the start (a worker that never came up).
    """

    def __init__(
        self,
        script: str | os.PathLike | None = None,
        num_workers: int = 2,
        *,
        module: str | None = None,
        args: Sequence[str] = (),
        timeout: float = 120.0,
        collective_timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike | None = None,
        stream: bool = True,
        start: bool = True,
        grace: float = 1.0,
        host: str = "localhost",
        start_timeout: float | None = None,
    ) -> None:
        if (script is None) == (module is None):
            raise ValueError("give the workers a script or a module to run, not both or neither")
        self.script = Path(script) if script is not None else None
        self.module = module
        if self.script is not None and not self.script.is_file():
            raise FileNotFoundError(f"worker script {self.script} does not exist")
        if module is not None and importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"worker module {module} cannot be found")
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.num_workers = num_workers
        self.args = [str(a) for a in args]
        self.timeout = float(timeout)
        self.collective_timeout = collective_timeout if collective_timeout else float(timeout)
        self.extra_env = dict(env or {})
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.stream = stream
        self.grace = grace
        self.host = host
        self.start_timeout = start_timeout
        self.cluster: dict[str, list[str]] = {}
        self.processes: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        self.started_at: float | None = None
        self._log_files: list[IO[bytes]] = []
        self._logs = WorkerLogs(self.log_dir, num_workers) if self.log_dir is not None else None
        self._waiter: WorkerWaiter | None = None  # made by each start()
        self._lock = threading.Lock()
        if start:
            self.start()

    # -------------------------------------------------------------- life cycle
    @property
    def ports(self) -> list[int]:
        """The TCP ports of the workers' servers."""
        return [int(address.rsplit(":", 1)[1]) for address in self.cluster.get("worker", [])]

    @property
    def logs(self) -> WorkerLogs:
        """The workers' log files (read, tail, stream)."""
        assert self._logs is not None, "the cluster has not been started"
        return self._logs

    @property
    def log_paths(self) -> list[Path]:
        """One log file per worker (stdout and stderr together)."""
        return self.logs.paths

    def tf_config(self, index: int) -> dict:
        """The ``TF_CONFIG`` of worker ``index``."""
        return tf_config(self.cluster, "worker", index)

    def worker_env(self, index: int) -> dict[str, str]:
        """The full environment worker ``index`` runs with.

        TensorFlow's defaults, quiet logs, and a GPU of its own when the machine has one per
        worker, else no GPU (``settings.gpu_visibility``; ``devices_note`` says which).
        """
        env = dict(os.environ)
        env.update(WORKER_ENV)
        env["CUDA_VISIBLE_DEVICES"] = worker_gpus(index, self.num_workers)
        env["TF_CONFIG"] = json.dumps(self.tf_config(index))
        env[COLLECTIVE_TIMEOUT_ENV] = str(self.collective_timeout)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        env.update(self.extra_env)
        return env

    @property
    def devices_note(self) -> str:
        """Which devices the workers compute on: a GPU each, or the CPU (and why)."""
        gpus = len(visible_gpus())
        if gpus >= self.num_workers:
            return f"each of the {self.num_workers} workers computes on a GPU of its own"
        if gpus:
            return (f"the {self.num_workers} workers compute on the CPU: {gpus} GPU(s) for "
                    f"{self.num_workers} workers, and processes sharing a GPU would each "
                    "reserve nearly all of its memory")
        return f"the {self.num_workers} workers compute on the CPU (no GPU here)"

    def _prepare_start(self) -> None:
        """What every start does before its workers run: refuse a running cluster, close what a
        previous start left, fresh logs, cluster spec and clock, and a stop at exit."""
        if self.processes and self.running:
            raise RuntimeError("the cluster is running; stop() it before starting it again")
        self.stop()  # a restart: close what the previous start left
        self.processes, self._log_files = [], []
        if self.log_dir is None:
            self.log_dir = temporary_log_dir("cu_cluster_")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._logs = WorkerLogs(self.log_dir, self.num_workers)
        self.cluster = cluster_spec(self.num_workers, host=self.host)
        self.killed = set()
        self.started_at = time.monotonic()
        stop_at_exit(self)

    def start(self) -> LocalCluster:
        """Pick ports, write ``TF_CONFIG`` per worker and start every worker process.

        A stopped cluster can be started again (new ports, logs overwritten): that is how a job
        restarts after a failure and resumes from its checkpoint directory.
        """
        self._prepare_start()
        preexec = death_signal_setter()
        command = [sys.executable, *(["-m", self.module] if self.module else [str(self.script)]),
                   *self.args]
        try:
            for index, path in enumerate(self.log_paths):
                process, log = start_worker(command, self.worker_env(index), path, preexec)
                self.processes.append(process)
                self._log_files.append(log)
        except BaseException:
            self.stop()
            raise
        if self.stream and visible_gpus():
            print(self.devices_note)
        self._waiter = WorkerWaiter(
            self.processes, self._logs, self.ports, self.stop, host=self.host,
            timeout=self.timeout, start_timeout=self.start_timeout, killed=self.killed,
            started_at=self.started_at, stream=self.stream,
        )
        return self

    def __enter__(self) -> LocalCluster:
        if not self.processes:
            self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def poll(self) -> list[int | None]:
        """Each worker's exit code (None while it runs)."""
        return [p.poll() for p in self.processes]

    @property
    def running(self) -> bool:
        """True while any worker process is alive."""
        return any(code is None for code in self.poll())

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [p.pid for p in self.processes]

    @property
    def elapsed(self) -> float:
        """Seconds since the cluster started."""
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> float:
        """Kill worker ``index`` on purpose (SIGKILL by default), as a machine failure would.

        Returns the seconds since the cluster started (compare with ``WorkerError.elapsed``).
        """
        process = self.processes[index]
        self.killed.add(index)
        if process.poll() is None:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
            if sig == signal.SIGKILL:
                process.wait()
        return self.elapsed

    def stop(self, grace: float | None = None) -> list[int | None]:
        """Stop every worker: SIGTERM, wait ``grace`` seconds, then SIGKILL. Idempotent."""
        with self._lock:
            codes = stop_processes(self.processes, self.grace if grace is None else grace)
            for log in self._log_files:
                log.close()
            self._log_files = []
            forget_at_exit(self)
            return codes

    def cleanup(self) -> None:
        """Stop the workers and delete the log directory if the cluster created it."""
        self.stop()
        if self._own_log_dir and self.log_dir is not None:
            remove_log_dir(self.log_dir)

    # -------------------------------------------------------------- waiting (a WorkerWaiter's)
    @property
    def waiter(self) -> WorkerWaiter:
        """What waits on the workers of the current start (see :class:`WorkerWaiter`)."""
        if self._waiter is None:
            raise RuntimeError("the cluster has not been started; call start() first")
        return self._waiter

    def serving(self) -> list[bool]:
        """For each worker, whether its server accepts connections on its port (or it is done)."""
        return self.waiter.serving()

    def wait_until_serving(self, timeout: float | None = None, poll_interval: float = 0.1) -> float:
        """Wait until every worker's server listens; return the seconds since the start.

        TensorFlow starts a worker's server when the script creates its strategy. Raises
        :class:`ClusterTimeoutError` naming the workers that did not come up (and stops the
        cluster), or :class:`WorkerError` if one fails first.
        """
        return self.waiter.wait_until_serving(timeout, poll_interval)

    def wait(self, timeout: float | None = None, poll_interval: float = 0.1) -> list[int]:
        """Wait until every worker exits; return their exit codes (all 0).

        Raises :class:`WorkerError` as soon as one worker fails (naming it, with its last log
        lines) and :class:`ClusterTimeoutError` after ``timeout`` seconds (default: the
        cluster's ``timeout``); either way, and on Ctrl-C, every worker is stopped first.
        """
        return self.waiter.wait(timeout, poll_interval)

    def wait_for(
        self,
        pattern: str,
        worker: int | None = None,
        timeout: float | None = None,
        poll_interval: float = 0.05,
    ) -> float:
        """Wait until a worker's log (any, or ``worker``) matches ``pattern`` (a regex).

        Returns the seconds since the cluster started. Raises :class:`WorkerError` if a worker
        fails first and :class:`ClusterTimeoutError` after ``timeout`` (the cluster is stopped
        in both cases).
        """
        return self.waiter.wait_for(pattern, worker, timeout, poll_interval)

    # -------------------------------------------------------------- logs
    def log(self, index: int) -> str:
        """Everything worker ``index`` has written so far."""
        return self.logs.read(index)

    def tail(self, index: int, lines: int = 20) -> str:
        """The last ``lines`` lines of worker ``index``'s log."""
        return self.logs.tail(index, lines)

    def tfjob_manifest(self, name: str, image: str, **kwargs: Any) -> dict:
        """The Kubeflow ``TFJob`` that runs this same script on a Kubernetes cluster.

        Same script, arguments and extra ``env`` as the local workers (pass ``env`` to change
        it); no ``TF_CONFIG``, which the training operator writes into every pod.
        """
        command = ["python", self.script.name, *self.args]
        kwargs.setdefault("env", self.extra_env)
        return tfjob_manifest(name, image, command, num_workers=self.num_workers, **kwargs)

    def __repr__(self) -> str:
        state = "running" if self.processes and self.running else "stopped"
        return f"LocalCluster({self.script.name!r}, num_workers={self.num_workers}, {state})"
