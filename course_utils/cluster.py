"""Real TensorFlow clusters on one machine: multi-worker subprocesses, in-process parameter servers.

* :class:`LocalCluster` starts one subprocess per worker, each running your script with its own
  ``TF_CONFIG`` (free ports picked with portpicker), keeps a log file per worker and streams it,
  and always cleans up (context manager, ``atexit``, Ctrl-C): SIGTERM, then SIGKILL, because hung
  TensorFlow workers ignore SIGTERM. A failed or hung worker becomes a :class:`WorkerError` or
  :class:`ClusterTimeoutError` carrying its last log lines, never a hung notebook.
* In the worker script, :func:`worker_strategy` builds the MultiWorkerMirroredStrategy with
  collective time-outs, and :func:`task` / :func:`is_chief` say who this process is.
* :func:`start_in_process_cluster` starts workers and parameter servers as
  ``tf.distribute.Server`` objects in this process, for ``ParameterServerStrategy``.
* :func:`tf_config`, :func:`cluster_spec` and :func:`tfjob_manifest` describe the same job for a
  real cluster (a Kubeflow ``TFJob`` for Kubernetes).

Example (a notebook)::

    %%writefile worker.py
    import course_utils as cu
    strategy = cu.cluster.worker_strategy()
    ...

    with cu.cluster.LocalCluster("worker.py", num_workers=2, timeout=60) as cluster:
        cluster.wait()
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ClusterTimeoutError",
    "InProcessCluster",
    "LocalCluster",
    "WorkerError",
    "cluster_spec",
    "is_chief",
    "pick_ports",
    "start_in_process_cluster",
    "task",
    "tf_config",
    "tfjob_manifest",
    "to_yaml",
    "worker_strategy",
]

#: Environment every worker gets: no GPUs (co-located CPU workers), quiet TensorFlow logs.
WORKER_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "PYTHONUNBUFFERED": "1",
    "GRPC_FAIL_FAST": "use_caller",
}
#: Environment variable that passes the collective time-out (seconds) to worker scripts.
COLLECTIVE_TIMEOUT_ENV = "COURSE_COLLECTIVE_TIMEOUT"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------- TF_CONFIG helpers
def pick_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on this machine (chosen with portpicker)."""
    import portpicker

    ports: list[int] = []
    while len(ports) < count:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


def cluster_spec(
    num_workers: int,
    num_ps: int = 0,
    *,
    chief: bool = False,
    host: str = "localhost",
    ports: Sequence[int] | None = None,
) -> dict[str, list[str]]:
    """A cluster spec ``{"chief": [...], "worker": [...], "ps": [...]}`` of host:port strings."""
    if num_workers < 0 or num_ps < 0 or num_workers + num_ps + int(chief) == 0:
        raise ValueError("a cluster needs at least one task")
    needed = int(chief) + num_workers + num_ps
    ports = list(ports) if ports is not None else pick_ports(needed)
    if len(ports) != needed:
        raise ValueError(f"need {needed} ports, got {len(ports)}")
    addresses = iter(f"{host}:{port}" for port in ports)
    spec: dict[str, list[str]] = {}
    if chief:
        spec["chief"] = [next(addresses)]
    if num_workers:
        spec["worker"] = [next(addresses) for _ in range(num_workers)]
    if num_ps:
        spec["ps"] = [next(addresses) for _ in range(num_ps)]
    return spec


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict:
    """The ``TF_CONFIG`` dictionary of one task (``json.dumps`` it into the environment)."""
    if task_type not in cluster:
        raise ValueError(f"task type {task_type!r} is not in the cluster {sorted(cluster)}")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(
            f"task index {task_index} out of range: {task_type} has {len(cluster[task_type])} tasks"
        )
    return {
        "cluster": {name: list(addresses) for name, addresses in cluster.items()},
        "task": {"type": task_type, "index": task_index},
    }


def task(environ: Mapping[str, str] | None = None) -> tuple[str | None, int | None]:
    """``(task_type, task_index)`` of this process from ``TF_CONFIG`` (None, None if unset)."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        return None, None
    info = json.loads(raw).get("task", {})
    return info.get("type"), info.get("index")


def is_chief(environ: Mapping[str, str] | None = None) -> bool:
    """True for the task that writes checkpoints and summaries: the chief, else worker 0."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        return True
    config = json.loads(raw)
    task_type, index = config.get("task", {}).get("type"), config.get("task", {}).get("index")
    if task_type == "chief":
        return True
    return task_type == "worker" and index == 0 and "chief" not in config.get("cluster", {})


def worker_strategy(timeout_seconds: float | None = None) -> Any:
    """In a worker script: a MultiWorkerMirroredStrategy from ``TF_CONFIG`` with time-outs.

    The collective time-out (default: what :class:`LocalCluster` passes in
    ``COURSE_COLLECTIVE_TIMEOUT``, else none) turns a stalled peer into a ``DeadlineExceededError``
    instead of a hang. Call it at the start of the script, before any other TensorFlow work.
    """
    import tensorflow as tf

    if not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "TF_CONFIG is not set: run this script through cu.cluster.LocalCluster (or set "
            "TF_CONFIG yourself) before creating a MultiWorkerMirroredStrategy"
        )
    if timeout_seconds is None and os.environ.get(COLLECTIVE_TIMEOUT_ENV):
        timeout_seconds = float(os.environ[COLLECTIVE_TIMEOUT_ENV])
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


# ---------------------------------------------------------------------------- errors
class WorkerError(RuntimeError):
    """A worker of a :class:`LocalCluster` failed.

    Attributes: ``worker`` (its index), ``returncode``, ``log_tail`` (its last log lines) and
    ``elapsed`` (seconds from the cluster's start to when the failure was seen).
    """

    def __init__(
        self,
        message: str,
        worker: int,
        returncode: int | None,
        log_tail: str,
        elapsed: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.returncode = returncode
        self.log_tail = log_tail
        self.elapsed = elapsed


class ClusterTimeoutError(TimeoutError):
    """The cluster did not finish (or print what was awaited) within its time-out."""


# ---------------------------------------------------------------------------- local cluster
_LIVE_CLUSTERS: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


def _stop_all_clusters() -> None:
    for cluster in list(_LIVE_CLUSTERS):
        cluster.stop()


atexit.register(_stop_all_clusters)


def _death_signal_setter() -> Any:
    """A function for ``preexec_fn`` that makes Linux SIGKILL a worker when its parent dies.

    libc is loaded here, in the parent: the child, forked from a process with TensorFlow's
    threads, must not import anything between fork and exec.
    """
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return set_death_signal


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class LocalCluster:
    """A multi-worker cluster on localhost: one subprocess per worker, each running ``script``.

    Args:
        script: the Python file every worker runs (``sys.executable script *args``).
        num_workers: number of workers (task type ``worker``, index 0 is the chief).
        args: extra command-line arguments for the script.
        timeout: seconds :meth:`wait` waits for all workers before raising
            :class:`ClusterTimeoutError` (and stopping them).
        collective_timeout: seconds passed to the workers' ``CommunicationOptions`` through
            ``COURSE_COLLECTIVE_TIMEOUT`` (read by :func:`worker_strategy`); default ``timeout``.
        env: extra environment variables for every worker.
        log_dir: where ``worker-<i>.log`` files go (default: a new temporary directory).
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
        script: str | os.PathLike,
        num_workers: int = 2,
        *,
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
        self.script = Path(script)
        if not self.script.is_file():
            raise FileNotFoundError(f"worker script {self.script} does not exist")
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
        self._serving = False
        self.cluster: dict[str, list[str]] = {}
        self.processes: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        self.started_at: float | None = None
        self._logs: list[Any] = []
        self._offsets: list[int] = []
        self._lock = threading.Lock()
        if start:
            self.start()

    # -------------------------------------------------------------- life cycle
    @property
    def ports(self) -> list[int]:
        """The TCP ports of the workers' servers."""
        return [int(address.rsplit(":", 1)[1]) for address in self.cluster.get("worker", [])]

    @property
    def log_paths(self) -> list[Path]:
        """One log file per worker (stdout and stderr together)."""
        assert self.log_dir is not None, "the cluster has not been started"
        return [self.log_dir / f"worker-{i}.log" for i in range(self.num_workers)]

    def tf_config(self, index: int) -> dict:
        """The ``TF_CONFIG`` of worker ``index``."""
        return tf_config(self.cluster, "worker", index)

    def worker_env(self, index: int) -> dict[str, str]:
        """The full environment worker ``index`` runs with."""
        env = dict(os.environ)
        env.update(WORKER_ENV)
        env["TF_CONFIG"] = json.dumps(self.tf_config(index))
        env[COLLECTIVE_TIMEOUT_ENV] = str(self.collective_timeout)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        env.update(self.extra_env)
        return env

    def start(self) -> LocalCluster:
        """Pick ports, write ``TF_CONFIG`` per worker and start every worker process.

        A stopped cluster can be started again (new ports, logs overwritten): that is how a job
        restarts after a failure and resumes from its checkpoint directory.
        """
        if self.processes and self.running:
            raise RuntimeError("the cluster is running; stop() it before starting it again")
        self.stop()  # a restart: close what the previous start left
        self.processes, self._logs = [], []
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="cu_cluster_"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster_spec(self.num_workers, host=self.host)
        self.killed = set()
        self._serving = False
        self._offsets = [0] * self.num_workers
        self.started_at = time.monotonic()
        _LIVE_CLUSTERS.add(self)
        preexec = _death_signal_setter()
        try:
            for index in range(self.num_workers):
                log = open(self.log_paths[index], "wb")  # noqa: SIM115 - closed in stop()
                self._logs.append(log)
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, str(self.script), *self.args],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=self.worker_env(index),
                        cwd=os.getcwd(),
                        start_new_session=True,  # own process group: kill it with its children
                        preexec_fn=preexec,  # die with the notebook kernel
                    )
                )
        except BaseException:
            self.stop()
            raise
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
        grace = self.grace if grace is None else grace
        with self._lock:
            alive = [p for p in self.processes if p.poll() is None]
            for process in alive:
                self._signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for process in alive:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for process in alive:
                # SIGKILL the whole group: hung TensorFlow workers ignore SIGTERM.
                self._signal_group(process, signal.SIGKILL)
            for process in self.processes:
                process.wait()
            codes = [p.returncode for p in self.processes]
            for log in self._logs:
                log.close()
            self._logs = []
            _LIVE_CLUSTERS.discard(self)
            return codes

    @staticmethod
    def _signal_group(process: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self) -> None:
        """Stop the workers and delete the log directory if the cluster created it."""
        self.stop()
        if self._own_log_dir and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # -------------------------------------------------------------- logs
    def log(self, index: int) -> str:
        """Everything worker ``index`` has written so far."""
        return self.log_paths[index].read_text(errors="replace")

    def tail(self, index: int, lines: int = 20) -> str:
        """The last ``lines`` lines of worker ``index``'s log."""
        return "\n".join(self.log(index).splitlines()[-lines:])

    def _stream_new_lines(self) -> None:
        if not self.stream or self.log_dir is None:
            return
        for index, path in enumerate(self.log_paths):
            try:
                with open(path, "rb") as handle:
                    handle.seek(self._offsets[index])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # print whole lines only
            if end:
                self._offsets[index] += end
                for line in chunk[:end].decode(errors="replace").splitlines():
                    print(f"[worker {index}] {line}", flush=True)

    # -------------------------------------------------------------- waiting
    def serving(self) -> list[bool]:
        """For each worker, whether its server accepts connections on its port (or it is done)."""
        import socket

        states = []
        for index, port in enumerate(self.ports):
            if self.processes and self.processes[index].poll() is not None:
                states.append(True)  # finished (or failed: reported elsewhere)
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.2)
                states.append(probe.connect_ex((self.host, port)) == 0)
        return states

    def wait_until_serving(self, timeout: float | None = None, poll_interval: float = 0.1) -> float:
        """Wait until every worker's server listens; return the seconds since the start.

        TensorFlow starts a worker's server when the script creates its strategy. Raises
        :class:`ClusterTimeoutError` naming the workers that did not come up (and stops the
        cluster), or :class:`WorkerError` if one fails first.
        """
        timeout = (self.start_timeout or self.timeout) if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._stream_new_lines()
                error = self._failure()
                if error is not None:
                    self.stop()
                    raise error
                if all(self.serving()):
                    self._serving = True
                    return self.elapsed
                if time.monotonic() > deadline:
                    raise self._not_serving_error(timeout)
                time.sleep(poll_interval)
        except KeyboardInterrupt:
            self.stop()
            raise

    def _not_serving_error(self, timeout: float) -> ClusterTimeoutError:
        missing = [i for i, up in enumerate(self.serving()) if not up]
        error = self._timeout_error(
            f"worker(s) {', '.join(map(str, missing))} did not start a server on their port",
            timeout,
        )
        self.stop()
        return error

    def _check_started(self) -> None:
        if self.start_timeout is None or self._serving or self.elapsed < self.start_timeout:
            return
        if all(self.serving()):
            self._serving = True
            return
        raise self._not_serving_error(self.start_timeout)

    def _failure(self) -> WorkerError | None:
        failed = [
            (i, code) for i, code in enumerate(self.poll()) if code is not None and code != 0
        ]
        if not failed:
            return None
        first, code = next(((i, c) for i, c in failed if i in self.killed), failed[0])
        how = "was killed on purpose" if first in self.killed else "failed"
        parts = [f"worker {first} {how} ({_describe_exit(code)}). Last lines of its log:"]
        parts.append(self._indent(self.tail(first)))
        for other in range(self.num_workers):
            if other != first:
                state = _describe_exit(self.processes[other].poll())
                parts.append(f"worker {other} ({state}), last lines:")
                parts.append(self._indent(self.tail(other, 5)))
        parts.append(f"Full logs: {self.log_dir}")
        return WorkerError("\n".join(parts), first, code, self.tail(first), self.elapsed)

    @staticmethod
    def _indent(text: str) -> str:
        return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"

    def _timeout_error(self, what: str, timeout: float) -> ClusterTimeoutError:
        parts = [f"{what} within {timeout:.0f} s; stopping the cluster."]
        for index in range(self.num_workers):
            state = _describe_exit(self.processes[index].poll())
            parts.append(f"worker {index} ({state}), last lines:")
            parts.append(self._indent(self.tail(index, 10)))
        parts.append(f"Full logs: {self.log_dir}")
        return ClusterTimeoutError("\n".join(parts))

    def wait(self, timeout: float | None = None, poll_interval: float = 0.1) -> list[int]:
        """Wait until every worker exits; return their exit codes (all 0).

        Raises :class:`WorkerError` as soon as one worker fails (naming it, with its last log
        lines) and :class:`ClusterTimeoutError` after ``timeout`` seconds; either way, and on
        Ctrl-C, every worker is stopped first.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._stream_new_lines()
                error = self._failure()
                if error is not None:
                    self.stop()
                    self._stream_new_lines()
                    raise error
                self._check_started()
                codes = self.poll()
                if all(code == 0 for code in codes):
                    self._stream_new_lines()
                    self.stop()
                    return [int(c) for c in codes]
                if time.monotonic() > deadline:
                    error = self._timeout_error("the workers did not finish", timeout)
                    self.stop()
                    raise error
                time.sleep(poll_interval)
        except KeyboardInterrupt:
            self.stop()
            raise

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
        timeout = self.timeout if timeout is None else timeout
        regex = re.compile(pattern, re.MULTILINE)
        indices = range(self.num_workers) if worker is None else [worker]
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._stream_new_lines()
                if any(regex.search(self.log(i)) for i in indices):
                    return self.elapsed
                error = self._failure()
                if error is not None:
                    self.stop()
                    raise error
                self._check_started()
                if time.monotonic() > deadline:
                    error = self._timeout_error(f"no log line matched {pattern!r}", timeout)
                    self.stop()
                    raise error
                time.sleep(poll_interval)
        except KeyboardInterrupt:
            self.stop()
            raise

    def tfjob_manifest(self, name: str, image: str, **kwargs: Any) -> dict:
        """The Kubeflow ``TFJob`` that runs this same script on a Kubernetes cluster."""
        command = ["python", self.script.name, *self.args]
        return tfjob_manifest(name, image, command, num_workers=self.num_workers, **kwargs)

    def __repr__(self) -> str:
        state = "running" if self.processes and self.running else "stopped"
        return f"LocalCluster({self.script.name!r}, num_workers={self.num_workers}, {state})"


# ---------------------------------------------------------------------------- parameter servers
@dataclass
class InProcessCluster:
    """Workers and parameter servers running as ``tf.distribute.Server`` objects in this process."""

    cluster: dict[str, list[str]]
    resolver: Any
    servers: list[Any] = field(repr=False)
    _strategies: dict[Any, Any] = field(default_factory=dict, repr=False)

    def strategy(self, variable_partitioner: Any = None) -> Any:
        """The ``ParameterServerStrategy`` for this cluster (one per partitioner, reused)."""
        import tensorflow as tf

        key = id(variable_partitioner) if variable_partitioner is not None else None
        if key not in self._strategies:
            self._strategies[key] = tf.distribute.ParameterServerStrategy(
                self.resolver, variable_partitioner=variable_partitioner
            )
        return self._strategies[key]


_IN_PROCESS: dict[tuple[int, int], InProcessCluster] = {}


def start_in_process_cluster(num_workers: int = 2, num_ps: int = 1) -> InProcessCluster:
    """Start (once per size) workers and parameter servers in this process, gRPC on localhost.

    The servers live as long as the process: TensorFlow cannot stop an in-process server, so the
    same cluster is returned when a notebook cell runs again. This process is the coordinator.
    """
    if (num_workers, num_ps) in _IN_PROCESS:
        return _IN_PROCESS[(num_workers, num_ps)]
    if num_workers < 1 or num_ps < 1:
        raise ValueError("a parameter-server cluster needs at least one worker and one ps")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf

    spec = cluster_spec(num_workers, num_ps)
    cluster = tf.train.ClusterSpec(spec)
    worker_config = tf.compat.v1.ConfigProto()
    if (os.cpu_count() or 1) < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1
    servers = [
        tf.distribute.Server(
            cluster, job_name="worker", task_index=i, config=worker_config, protocol="grpc"
        )
        for i in range(num_workers)
    ]
    servers += [
        tf.distribute.Server(cluster, job_name="ps", task_index=i, protocol="grpc")
        for i in range(num_ps)
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    result = InProcessCluster(cluster=spec, resolver=resolver, servers=servers)
    _IN_PROCESS[(num_workers, num_ps)] = result
    return result


# ---------------------------------------------------------------------------- Kubernetes
def tfjob_manifest(
    name: str,
    image: str,
    command: Sequence[str],
    *,
    num_workers: int = 2,
    num_ps: int = 0,
    chief: bool = False,
    namespace: str | None = None,
    gpus_per_worker: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    env: Mapping[str, str] | None = None,
    restart_policy: str = "OnFailure",
) -> dict:
    """A Kubeflow training-operator ``TFJob`` (kubeflow.org/v1) for the same job.

    The operator sets ``TF_CONFIG`` in every pod, so the script that ran on localhost runs
    unchanged. Write it with :func:`to_yaml` and apply it with ``kubectl apply -f``.
    """
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        raise ValueError(f"{name!r} is not a valid Kubernetes name (lower case, digits, '-')")
    resources: dict[str, dict[str, Any]] = {}
    limits: dict[str, Any] = {}
    if gpus_per_worker:
        limits["nvidia.com/gpu"] = gpus_per_worker
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if limits:
        resources = {"limits": limits}

    def replica(count: int, gpus: bool) -> dict:
        container: dict[str, Any] = {
            "name": "tensorflow",  # the training operator requires this container name
            "image": image,
            "command": list(command),
        }
        if env:
            container["env"] = [{"name": k, "value": str(v)} for k, v in env.items()]
        if resources and gpus:
            container["resources"] = resources
        return {
            "replicas": count,
            "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [container]}},
        }

    specs: dict[str, Any] = {}
    if chief:
        specs["Chief"] = replica(1, True)
    if num_workers:
        specs["Worker"] = replica(num_workers, True)
    if num_ps:
        specs["PS"] = replica(num_ps, False)
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "tfReplicaSpecs": specs},
    }


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./-][A-Za-z0-9_./: -]*", text) and not re.fullmatch(
        r"(?i)(true|false|yes|no|on|off|null|none|~|[-+]?[0-9.e]+)", text
    ) and not text.endswith(" ") and ": " not in text:
        return text
    return json.dumps(text)


def to_yaml(value: Any, indent: int = 0) -> str:
    """YAML text of nested dicts, lists and scalars (enough for Kubernetes manifests)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        if not value:
            return pad + "{}"
        for key, item in value.items():
            if isinstance(item, (Mapping, list, tuple)) and item:
                lines.append(f"{pad}{key}:")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_yaml_inline(item)}")
    elif isinstance(value, (list, tuple)):
        if not value:
            return pad + "[]"
        for item in value:
            if isinstance(item, (Mapping, list, tuple)) and item:
                nested = to_yaml(item, indent + 2).splitlines()
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_yaml_inline(item)}")
    else:
        return pad + _yaml_scalar(value)
    return "\n".join(lines)


def _yaml_inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    return _yaml_scalar(value)
