"""Waiting on a local cluster: until it serves, finishes or logs a line; failures and time-outs.

:class:`WaitingMixin` is the waiting half of :class:`~course_utils.cluster.LocalCluster`: every
wait polls the workers, streams their logs, turns a failed worker into a ``WorkerError`` and a
deadline into a ``ClusterTimeoutError``, and stops the cluster on any way out (Ctrl-C included).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ClusterTimeoutError, timeout_error, worker_failure
from .logs import WorkerLogs

__all__ = ["WaitingMixin"]

_T = TypeVar("_T")


class WaitingMixin:
    """``wait``, ``wait_for``, ``wait_until_serving`` and ``serving`` for a cluster of workers.

    The class it is mixed into provides the attributes annotated here and ``poll()``,
    ``stop()``, ``log(i)``, ``logs``, ``elapsed``, ``ports`` and ``_stream_new_lines()``.
    """

    processes: list[subprocess.Popen]
    killed: set[int]
    num_workers: int
    host: str
    timeout: float
    start_timeout: float | None
    _serving: bool = False

    # Provided by the cluster class (declared for readers and type checkers).
    logs: WorkerLogs
    elapsed: float
    ports: list[int]
    poll: Callable[[], list[int | None]]
    stop: Callable[..., Any]
    log: Callable[[int], str]
    _stream_new_lines: Callable[[], None]

    def serving(self) -> list[bool]:
        """For each worker, whether its server accepts connections on its port (or it is done)."""
        states = []
        for index, port in enumerate(self.ports):
            if self.processes and self.processes[index].poll() is not None:
                states.append(True)  # finished (or failed: reported elsewhere)
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.2)
                states.append(probe.connect_ex((self.host, port)) == 0)
        return states

    def _poll_until(
        self,
        step: Callable[[], _T | None],
        timeout: float,
        on_timeout: Callable[[], Exception],
        poll_interval: float,
    ) -> _T:
        """Run ``step`` every ``poll_interval`` s until it returns a value; stop on any way out."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._stream_new_lines()
                result = step()
                if result is not None:
                    return result
                if time.monotonic() > deadline:
                    raise on_timeout()
                time.sleep(poll_interval)
        except KeyboardInterrupt:
            self.stop()
            raise

    def _raise_if_failed(self) -> None:
        error = worker_failure(self.poll(), self.killed, self.logs, self.elapsed)
        if error is not None:
            self.stop()
            self._stream_new_lines()
            raise error

    def _timed_out(self, what: str, timeout: float) -> ClusterTimeoutError:
        error = timeout_error(what, timeout, self.poll(), self.logs)
        self.stop()
        return error

    def _not_serving_error(self, timeout: float) -> ClusterTimeoutError:
        missing = [i for i, up in enumerate(self.serving()) if not up]
        what = f"worker(s) {', '.join(map(str, missing))} did not start a server on their port"
        return self._timed_out(what, timeout)

    def _check_started(self) -> None:
        if self.start_timeout is None or self._serving or self.elapsed < self.start_timeout:
            return
        if all(self.serving()):
            self._serving = True
            return
        raise self._not_serving_error(self.start_timeout)

    def wait_until_serving(self, timeout: float | None = None, poll_interval: float = 0.1) -> float:
        """Wait until every worker's server listens; return the seconds since the start.

        TensorFlow starts a worker's server when the script creates its strategy. Raises
        :class:`ClusterTimeoutError` naming the workers that did not come up (and stops the
        cluster), or :class:`WorkerError` if one fails first.
        """
        timeout = (self.start_timeout or self.timeout) if timeout is None else timeout

        def step() -> float | None:
            self._raise_if_failed()
            if all(self.serving()):
                self._serving = True
                return self.elapsed
            return None

        return self._poll_until(step, timeout, lambda: self._not_serving_error(timeout),
                                poll_interval)

    def wait(self, timeout: float | None = None, poll_interval: float = 0.1) -> list[int]:
        """Wait until every worker exits; return their exit codes (all 0).

        Raises :class:`WorkerError` as soon as one worker fails (naming it, with its last log
        lines) and :class:`ClusterTimeoutError` after ``timeout`` seconds; either way, and on
        Ctrl-C, every worker is stopped first.
        """
        timeout = self.timeout if timeout is None else timeout

        def step() -> list[int] | None:
            self._raise_if_failed()
            self._check_started()
            codes = self.poll()
            if all(code == 0 for code in codes):
                self._stream_new_lines()
                self.stop()
                return [int(c) for c in codes]
            return None

        return self._poll_until(
            step, timeout, lambda: self._timed_out("the workers did not finish", timeout),
            poll_interval,
        )

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

        def step() -> float | None:
            if any(regex.search(self.log(i)) for i in indices):
                return self.elapsed
            self._raise_if_failed()
            self._check_started()
            return None

        return self._poll_until(
            step, timeout, lambda: self._timed_out(f"no log line matched {pattern!r}", timeout),
            poll_interval,
        )

