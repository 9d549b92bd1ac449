"""Lesson 03's check workers, forked from one process that has already imported TensorFlow.

Each worker of a check's job is a fresh process running the check's script. Importing
TensorFlow and Keras is nearly all that such a worker costs (measured here: about 8 of its
9 CPU-seconds), and a check starts 5 of them. So the check starts one *zygote* per
interpreter: a plain Python process that imports ``tensorflow``, ``keras`` and ``numpy``,
runs nothing (no op, no device, no context), and forks a worker on request. A forked worker
starts its own process group, gets its log file as stdout and stderr, its own environment
(``TF_CONFIG`` included) and its script's arguments, and runs the script as ``__main__``: its
TensorFlow runtime, devices, collectives and servers are made in the worker, after the fork,
as in a worker started from scratch. It dies with the zygote (a parent-death signal), and the
zygote stops when this process goes (its stdin, a pipe from here, closes; a kill included).

:class:`ForkedCluster` is a :class:`~course_utils.cluster.LocalCluster` whose ``start`` forks
its workers this way (ports, ``TF_CONFIG``, environment, logs, waiting, killing and stopping
are the cluster's own); where no zygote can start (no ``fork``), it starts them as the
cluster does.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from course_utils.cluster import LocalCluster
from course_utils.cluster.tf_config import cluster_spec
from course_utils.cluster.waiting import WorkerWaiter

__all__ = ["ForkedCluster", "once_more_if_transient"]

#: What a job's failure says when the cluster's own transport failed, not the learner's code:
#: TensorFlow's errors of a collective or an RPC between the workers, and gRPC's own.
TRANSIENT = re.compile(r"\b(?:DeadlineExceededError|UnavailableError|AbortedError|"
                       r"CancelledError)\b|Unable to parse request|stopped sending heartbeats")

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

#: What the zygote imports before it forks a worker (with the datasets' audit the set-up binds).
ZYGOTE_IMPORTS = "numpy, tensorflow, keras, course_utils.grading.checks.dataset_audit"

#: Seconds the zygote may take to import TensorFlow (generous: both cores may be busy).
ZYGOTE_START_TIMEOUT = 300.0

_lock = threading.Lock()
_zygote: dict[str, Any] = {}


def _stop_zygote() -> None:
    process = _zygote.pop("process", None)
    if process is not None:
        try:
            process.stdin.close()                 # the zygote's signal to stop
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        process.stdout.close()
    if "folder" in _zygote:
        shutil.rmtree(_zygote.pop("folder"), ignore_errors=True)


def _zygote_address(env: dict[str, str]) -> str | None:
    """The socket of this interpreter's zygote (started with ``env`` if none runs), or None
    where none can start."""
    if not hasattr(os, "fork") or not hasattr(socket, "recv_fds") or sys.platform != "linux":
        return None
    with _lock:
        process = _zygote.get("process")
        if process is not None and process.poll() is None:
            return _zygote["address"]
        _stop_zygote()
        folder = tempfile.mkdtemp(prefix="lesson03_zygote_")   # only its owner may connect
        if len(folder) > 90:                        # a socket's path holds at most 107 bytes
            os.rmdir(folder)
            folder = tempfile.mkdtemp(prefix="l03z_", dir="/tmp")
        address = os.path.join(folder, "zygote.sock")
        env = {name: value for name, value in env.items() if name != "TF_CONFIG"}
        code = _ZYGOTE.replace("{imports}", ZYGOTE_IMPORTS)
        process = subprocess.Popen(
            [sys.executable, "-c", code, address], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd(),
            start_new_session=True)   # no parent-death signal: that follows the thread that
        # started it (a check may run in a pool's thread); it stops when its stdin closes
        _zygote.update(process=process, folder=folder, address=address)
        if _first_line(process, ZYGOTE_START_TIMEOUT) != b"ready\n":
            _stop_zygote()
            return None
        return address


def _first_line(process: subprocess.Popen, timeout: float) -> bytes:
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0] if line else b""


atexit.register(_stop_zygote)


def once_more_if_transient(attempt: Callable[[], str | None],
                           failed: str = "the job failed:") -> str | None:
    """``attempt()``'s verdict (None: right), run once more when its first verdict is a job
    that failed as a cluster's transport fails (:data:`TRANSIENT`): on 2 cores, busy with
    other clusters, such a failure was seen now and then in a job of right answers. A wrong
    answer that makes its job fail this way fails both times; only the second verdict counts.
    """
    verdict = attempt()
    if verdict is not None and verdict.startswith(failed) and TRANSIENT.search(verdict):
        verdict = attempt()
    return verdict


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
    """A :class:`LocalCluster` whose workers are forked from the zygote (see the module)."""

    def start(self) -> ForkedCluster:
        address = _zygote_address(self._zygote_env())
        if address is None or self.script is None:
            return super().start()
        self._prepare_start()
        try:
            for index, path in enumerate(self.log_paths):
                log = open(path, "wb")  # noqa: SIM115 - closed by stop()
                self._log_files.append(log)
                self.processes.append(ForkedWorker(address, str(self.script.resolve()),
                                                   self.args, self.worker_env(index), log))
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
