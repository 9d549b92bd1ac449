"""Worker processes, low level: start one, signal its process group, stop a group of them.

Every worker runs in its own session (process group), so a signal reaches the children it
started too. Stopping is SIGTERM, a grace period, then SIGKILL: a hung TensorFlow worker ignores
SIGTERM. On Linux a worker also gets SIGKILL when the process that started it dies, and
:func:`stop_at_exit` stops whatever is still running when the interpreter exits.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "death_signal_setter",
    "describe_exit",
    "forget_at_exit",
    "signal_group",
    "start_worker",
    "stop_at_exit",
    "stop_processes",
]


class _Stoppable(Protocol):
    def stop(self) -> Any: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _stop_all() -> None:
    for owner in list(_LIVE):
        owner.stop()


atexit.register(_stop_all)


def stop_at_exit(owner: _Stoppable) -> None:
    """Call ``owner.stop()`` when the interpreter exits, unless :func:`forget_at_exit` ran."""
    _LIVE.add(owner)


def forget_at_exit(owner: _Stoppable) -> None:
    """Undo :func:`stop_at_exit` (the owner has stopped its processes itself)."""
    _LIVE.discard(owner)


def death_signal_setter() -> Callable[[], None] | None:
    """A function for ``preexec_fn`` that makes Linux SIGKILL a worker when its parent dies.

    libc is loaded here, in the parent: the child, forked from a process with TensorFlow's
    threads, must not import anything between fork and exec. None where Linux's ``prctl`` is
    missing.
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


def describe_exit(returncode: int | None) -> str:
    """A process's state in words: "still running", "exit code 1", "killed by SIGKILL"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def start_worker(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    preexec: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen, IO[bytes]]:
    """Start ``command`` in its own process group, stdout and stderr into ``log_path``.

    Returns the process and the open log file (close it once the process has stopped).
    """
    log = open(log_path, "wb")  # noqa: SIM115 - the caller closes it after the process stops
    try:
        process = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=os.getcwd(),
            start_new_session=True,  # own process group: kill it with its children
            preexec_fn=preexec,  # die with the notebook kernel
        )
    except BaseException:
        log.close()
        raise
    return process, log


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group of ``process``; a group already gone is no error."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_processes(processes: Sequence[subprocess.Popen], grace: float) -> list[int | None]:
    """SIGTERM every live group, wait ``grace`` seconds, SIGKILL them, reap all; the exit codes."""
    alive = [p for p in processes if p.poll() is None]
    for process in alive:
        signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in alive:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in alive:
        # SIGKILL the whole group: hung TensorFlow workers ignore SIGTERM.
        signal_group(process, signal.SIGKILL)
    for process in processes:
        process.wait()
    return [p.returncode for p in processes]
