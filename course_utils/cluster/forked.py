"""Workers forked from one process that has already imported TensorFlow.

A worker started from scratch spends nearly all of its start importing TensorFlow and Keras
(about 8 of its 9 CPU-seconds, measured on a 2-core AMD EPYC). :class:`ForkedCluster` is a
:class:`~course_utils.cluster.LocalCluster` whose workers are forked from a *zygote*: a plain
Python process that imports ``preload`` (by default NumPy, TensorFlow and Keras), runs nothing
(no op, no device, no context) and forks a worker on request. A forked worker starts its own
process group, gets its log file as stdout and stderr, its own environment (``TF_CONFIG``
included) and its script's arguments, and runs the script as ``__main__``: its TensorFlow
runtime, devices, collectives and servers are made in the worker, after the fork, as in a worker
started from scratch. It dies with the zygote (a parent-death signal), and the zygote stops when
this process goes (its stdin, a pipe from here, closes; a kill included). Ports, ``TF_CONFIG``,
logs, waiting, killing and stopping are the cluster's own. One zygote serves every cluster of
this process with the same imports and environment: what the imports saw, ``TF_USE_LEGACY_KERAS``
included (``TF_CONFIG``, the collective time-out and ``TMPDIR``, which each worker gets its own
of, aside). Where no zygote can start (no ``fork``, not Linux), the workers start as
:class:`LocalCluster` starts them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from course_utils.cluster.local import LocalCluster
from course_utils.cluster.tf_config import COLLECTIVE_TIMEOUT_ENV, cluster_spec
from course_utils.cluster.waiting import WorkerWaiter

__all__ = ["DEFAULT_PRELOAD", "ForkedCluster"]

#: The zygote: imports once, then forks one worker per request (a datagram holding the
#: request, with the log file's descriptor) and answers its pid, later its exit code.
_ZYGOTE = r'''
import ctypes, json, os, runpy, select, signal, socket, sys, tempfile, traceback
import {imports}   # every worker forked from here skips these imports
prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
server.bind(sys.argv[1])
server.listen(64)
children = {}


def run(request, log):
    os.setpgid(0, 0)                              # its own process group, as the zygote set
    prctl(1, signal.SIGKILL)                      # PR_SET_PDEATHSIG: dies with the zygote
    for target in (1, 2):
        os.dup2(log, target)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None                       # TMPDIR as the worker's environment says
    os.chdir(request["cwd"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(request["script"])
    code = 0
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
        if not isinstance(done.code, (int, type(None))):
            print(done.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def tell(conn, number):
    try:
        conn.send(str(number).encode())
    except OSError:                               # that checker stopped listening
        pass


print("ready", flush=True)
while True:
    ready = select.select([server, 0], [], [], 0.1)[0]
    if 0 in ready and not os.read(0, 1024):       # the checker went away
        break
    if server in ready:
        conn, _ = server.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
        pid = os.fork()
        if pid == 0:
            server.close()
            for other in [conn, *children.values()]:
                other.close()
            try:
                run(json.loads(data), fds[0])
            finally:
                os._exit(1)                       # never back into the zygote's loop
        try:
            os.setpgid(pid, pid)                  # before the checker may signal the group
        except OSError:
            pass
        os.close(fds[0])
        children[pid] = conn
        tell(conn, pid)
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        conn = children.pop(pid)
        tell(conn, os.waitstatus_to_exitcode(status))
        conn.close()
for pid in children:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
'''

#: What a zygote imports before it forks a worker, unless the cluster says otherwise.
DEFAULT_PRELOAD = "numpy, tensorflow, keras"
#: Seconds a zygote may take to import TensorFlow (generous: both cores may be busy).
ZYGOTE_START_TIMEOUT = 300.0

#: What each worker reads when it runs, not what the imports see: left out of the zygote's
#: environment, so that clusters with different values share one zygote.
_PER_CLUSTER = ("TF_CONFIG", COLLECTIVE_TIMEOUT_ENV, "TMPDIR")

_lock = threading.Lock()
#: (imports, environment) -> {"process", "folder", "address"} of the zygote that serves them.
_zygotes: dict[tuple, dict[str, Any]] = {}


def _stop(zygote: dict[str, Any]) -> None:
    process = zygote.pop("process", None)
    if process is not None:
        try:
            process.stdin.close()                 # the zygote's signal to stop
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        process.stdout.close()
    if "folder" in zygote:
        shutil.rmtree(zygote.pop("folder"), ignore_errors=True)


def _stop_zygotes() -> None:
    with _lock:
        for zygote in _zygotes.values():
            _stop(zygote)
        _zygotes.clear()


def _zygote(imports: str, env: dict[str, str]) -> dict[str, Any] | None:
    """The running zygote that imported ``imports`` with ``env`` (started if none runs), or
    None where none can start."""
    if not hasattr(os, "fork") or not hasattr(socket, "recv_fds") or sys.platform != "linux":
        return None
    env = {name: value for name, value in env.items() if name not in _PER_CLUSTER}
    key = (imports, tuple(sorted(env.items())))
    with _lock:
        zygote = _zygotes.setdefault(key, {})
        process = zygote.get("process")
        if process is not None and process.poll() is None:
            return zygote
        _stop(zygote)
        folder = tempfile.mkdtemp(prefix="zygote_")   # only its owner may connect
        if len(folder) > 90:                        # a socket's path holds at most 107 bytes
            os.rmdir(folder)
            folder = tempfile.mkdtemp(prefix="zygote_", dir="/tmp")
        address = os.path.join(folder, "zygote.sock")
        process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE.replace("{imports}", imports), address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            cwd=os.getcwd(), start_new_session=True)  # no parent-death signal: that follows
        # the thread that started it (a check may run in a pool's thread); it stops when its
        # stdin closes
        zygote.update(process=process, folder=folder, address=address)
        if _first_line(process, ZYGOTE_START_TIMEOUT) != b"ready\n":
            _stop(zygote)
            return None
        return zygote


def _first_line(process: subprocess.Popen, timeout: float) -> bytes:
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0] if line else b""


atexit.register(_stop_zygotes)


class ForkedWorker:
    """A worker the zygote forked: what a cluster and its waiter need of a ``Popen``."""

    def __init__(self, address: str, script: str, args: list[str], env: dict[str, str],
                 log: Any) -> None:
        self.args = [script, *args]
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._conn.connect(address)
        request = {"script": script, "args": args, "env": env, "cwd": os.getcwd()}
        socket.send_fds(self._conn, [json.dumps(request).encode()], [log.fileno()])
        self.pid = int(self._conn.recv(64))

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                answer = self._conn.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            self.returncode = int(answer) if answer else -9   # no answer: the zygote died
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.pid, 9)
        except OSError:
            pass


class ForkedCluster(LocalCluster):
    """A :class:`LocalCluster` whose workers are forked from a zygote that imported
    ``preload`` (a comma-separated list of modules; see the module's docstring)."""

    def __init__(self, *args: Any, preload: str = DEFAULT_PRELOAD, **kwargs: Any) -> None:
        self.preload = preload
        self.zygote_pid: int | None = None        # the zygote that forked the workers
        super().__init__(*args, **kwargs)

    def start(self) -> ForkedCluster:
        zygote = _zygote(self.preload, self._zygote_env())
        if zygote is None or self.script is None:
            return super().start()
        self.zygote_pid = zygote["process"].pid
        self._prepare_start()
        try:
            for index, path in enumerate(self.log_paths):
                log = open(path, "wb")  # noqa: SIM115 - closed by stop()
                self._log_files.append(log)
                self.processes.append(ForkedWorker(zygote["address"],
                                                   str(self.script.resolve()), self.args,
                                                   self.worker_env(index), log))
        except BaseException:
            self.stop()
            raise
        self._waiter = WorkerWaiter(
            self.processes, self._logs, self.ports, self.stop, host=self.host,
            timeout=self.timeout, start_timeout=self.start_timeout, killed=self.killed,
            started_at=self.started_at, stream=self.stream)
        return self

    def _zygote_env(self) -> dict[str, str]:
        """A worker's environment without its own part: the zygote imports with it."""
        self.cluster = self.cluster or cluster_spec(self.num_workers, host=self.host)
        env = self.worker_env(0)
        env["CUDA_VISIBLE_DEVICES"] = ""      # each worker sets its own before TF starts
        return env
