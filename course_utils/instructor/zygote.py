"""Grading kernels forked from one process that imported TensorFlow once.

Every graded notebook needs a fresh kernel, and a fresh kernel pays TensorFlow's import (about
5 CPU-seconds here) before the notebook's first cell does anything. The zygote pays it once:
``python -m course_utils.instructor.zygote SOCKET`` imports TensorFlow and IPython's kernel,
then, for each request on its Unix socket, forks a child that confines itself exactly as
``jail.py`` confines a fresh kernel (hidden folders, limits, the sandbox's user), takes the
notebook's working folder, environment and connection file, and becomes an IPython kernel.

Only the sandboxed grader (root) uses it: the socket lives in a folder only root may enter, the
kernel runs as the notebook's own sandbox user, and the grader kills every process of that user
when the notebook is done, so a forked kernel leaves nothing behind, as a fresh one does. The
kernel manager follows the forked kernel through a pidfd (``ZygoteProvisioner``). When the zygote
cannot start or answer, the grader starts a fresh kernel instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner

__all__ = ["Zygote", "ZygoteProvisioner", "fork_kernel", "main"]

READY = "zygote ready"


class Zygote:
    """A zygote process, started with the kernels' environment: wait until it is ``ready``,
    hand its ``socket`` to ``ZygoteProvisioner``, ``stop`` it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="cu-zygote-"))  # 0700: root's only
        self.socket = str(self.folder / "zygote.sock")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "course_utils.instructor.zygote", self.socket],
            env=env, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the zygote serves (RuntimeError, and the zygote stopped, if it does not)."""
        answered, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline().strip() if answered else ""
        if line != READY:
            self.stop()
            raise RuntimeError(f"the kernel zygote did not start ({line or 'no answer'})")

    def alive(self) -> bool:
        """True while the zygote runs."""
        return self.process.poll() is None

    def stop(self) -> None:
        """Kill the zygote (its kernels belong to their sandbox users and die with them)."""
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def fork_kernel(socket_path: str, request: dict[str, Any], timeout_s: float = 30.0) -> int:
    """Ask the zygote at ``socket_path`` for a kernel; return its process id (RuntimeError when
    the zygote cannot be reached or refuses)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(timeout_s)
            client.connect(socket_path)
            client.sendall(json.dumps(request).encode() + b"\n")
            answer = client.makefile().readline().strip()
    except OSError as error:
        raise RuntimeError(f"the kernel zygote cannot be reached: {error}") from error
    if not answer.isdigit():
        raise RuntimeError(f"the kernel zygote answered {answer!r}")
    return int(answer)


class _ForkedKernel:
    """What the kernel manager needs of a ``Popen``, for a kernel that is not our child."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            self._fd, self.returncode = None, -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._fd is not None:
            if not select.select([self._fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
            os.close(self._fd)
            self._fd, self.returncode = None, -signal.SIGKILL  # its status is the zygote's
        return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0)
        return None

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ZygoteProvisioner(LocalProvisioner):
    """Launches the kernel by asking the zygote (``socket_path``) to fork one, confined by
    ``jail`` (the spec ``jail.py`` would apply)."""

    socket_path: str = ""
    jail: dict[str, Any] | None = None

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:  # noqa: D102
        connection_file = cmd[cmd.index("-f") + 1]
        env = {k: v for k, v in (kwargs.get("env") or os.environ).items()
               if k != "JPY_PARENT_PID"}  # its parent is the zygote, not this process
        pid = fork_kernel(self.socket_path, {
            "connection_file": connection_file, "env": env,
            "cwd": str(kwargs.get("cwd") or os.getcwd()), "jail": self.jail or {}})
        self.process = _ForkedKernel(pid)
        self.pid, self.pgid = pid, pid  # the kernel starts its own session
        return self.connection_info


# --------------------------------------------------------------------------- the zygote itself

def _become_kernel(request: dict[str, Any], server: socket.socket,
                   connection: socket.socket) -> None:
    """In the forked child: confine, take the notebook's place, run the kernel."""
    from course_utils.instructor import jail  # standard library only, as jail.py runs

    server.close()
    connection.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1 << 16)
    jail.confine(request["jail"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    sys.path[0] = request["cwd"]  # as `python -m ipykernel_launcher` started there
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"]]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


def _reap(*_: Any) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main(argv: list[str]) -> None:
    """Serve kernels on the Unix socket ``argv[0]`` until killed."""
    import ipykernel.kernelapp  # noqa: F401  (what every kernel imports first)
    import tensorflow  # noqa: F401  (the import every graded notebook pays)

    from course_utils.instructor.sandbox_user import become_subreaper

    become_subreaper()  # what a kernel detaches stays in reach (the grader kills its user's)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(argv[0])
    os.chmod(argv[0], 0o600)
    server.listen(16)
    signal.signal(signal.SIGCHLD, _reap)  # forked kernels: their times count as the zygote's
    print(READY, flush=True)
    while True:
        connection, _ = server.accept()
        with connection:
            try:
                request = json.loads(connection.makefile().readline())
                pid = os.fork()
            except (OSError, ValueError) as error:
                connection.sendall(f"error: {error}\n".encode())
                continue
            if pid == 0:
                code = 0
                try:
                    _become_kernel(request, server, connection)
                except BaseException:  # noqa: BLE001  (a child must never return to the loop)
                    code = 70
                os._exit(code)
            connection.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1:])
