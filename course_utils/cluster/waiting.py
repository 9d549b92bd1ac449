"""Waiting on a cluster's workers: until they serve, finish or log a line; failures and time-outs.

:class:`WorkerWaiter` waits on one start of a cluster's workers (a
:class:`~course_utils.cluster.LocalCluster` makes one each time it starts and hands it the
processes, logs, ports and time-outs). Every wait polls the workers, streams their logs, turns a
failed worker into a ``WorkerError`` and a deadline into a ``ClusterTimeoutError``, and stops the
cluster on any way out but success (Ctrl-C included). :func:`poll_until` is that loop alone.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

from .errors import ClusterTimeoutError, timeout_error, worker_failure
from .logs import WorkerLogs

__all__ = ["WorkerWaiter", "poll_until"]

_T = TypeVar("_T")


class _Process(Protocol):
    """What the waiter needs of a worker process (a ``subprocess.Popen`` has it)."""

    def poll(self) -> int | None: ...


def poll_until(
    step: Callable[[], _T | None],
    timeout: float,
    on_timeout: Callable[[], Exception],
    stop: Callable[[], Any],
    poll_interval: float = 0.1,
) -> _T:
    """Call ``step`` every ``poll_interval`` s until it returns a value (not None), and return it.

    After ``timeout`` seconds raise ``on_timeout()`` (built before ``stop`` runs, so it can still
    see the processes' states). On any way out but a value (a time-out, an error ``step`` raises,
    Ctrl-C) ``stop()`` runs first.
    """
    deadline = time.monotonic() + timeout
    try:
        while True:
            result = step()
            if result is not None:
                return result
            if time.monotonic() > deadline:
                raise on_timeout()
            time.sleep(poll_interval)
    except BaseException:
        stop()
        raise


class WorkerWaiter:
    """Waits on the workers of one cluster start: ``wait``, ``wait_for``, ``wait_until_serving``.

    Args:
        processes: one process per worker (index ``i`` is worker ``i``).
        logs: the workers' log files, in the same order.
        ports: the TCP port each worker's server listens on.
        stop: stops every worker (the cluster's own ``stop``); called on any way out but success.
        host: where the servers listen.
        timeout: default seconds for :meth:`wait` and :meth:`wait_for`.
        start_timeout: when set, :meth:`wait` and :meth:`wait_for` raise
            :class:`ClusterTimeoutError` if some worker's server is not listening this many
            seconds after ``started_at``.
        killed: the workers killed on purpose, read at every check (the owner adds to it).
        started_at: ``time.monotonic()`` when the workers started (default: now).
        stream: print new log lines, prefixed ``[worker i]``, while waiting.
    """

    def __init__(
        self,
        processes: Sequence[_Process],
        logs: WorkerLogs,
        ports: Sequence[int],
        stop: Callable[[], Any],
        *,
        host: str = "localhost",
        timeout: float = 120.0,
        start_timeout: float | None = None,
        killed: Collection[int] = (),
        started_at: float | None = None,
        stream: bool = True,
    ) -> None:
        if not len(processes) == logs.count == len(ports):
            raise ValueError(
                f"one log and one port per worker: {len(processes)} processes, "
                f"{logs.count} logs, {len(ports)} ports"
            )
        self.processes = list(processes)
        self.logs = logs
        self.ports = list(ports)
        self.host = host
        self.timeout = float(timeout)
        self.start_timeout = start_timeout
        self.killed = killed
        self.started_at = time.monotonic() if started_at is None else started_at
        self.stream = stream
        self._stop = stop
        self._serving = False

    @property
    def elapsed(self) -> float:
        """Seconds since the workers started."""
        return time.monotonic() - self.started_at

    def poll(self) -> list[int | None]:
        """Each worker's exit code (None while it runs)."""
        return [process.poll() for process in self.processes]

    def serving(self) -> list[bool]:
        """For each worker, whether its server accepts connections on its port (or it is done)."""
        states = []
        for process, port in zip(self.processes, self.ports, strict=True):
            if process.poll() is not None:
                states.append(True)  # finished (or failed: reported elsewhere)
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.2)
                states.append(probe.connect_ex((self.host, port)) == 0)
        return states

    def wait_until_serving(self, timeout: float | None = None, poll_interval: float = 0.1) -> float:
        """Wait until every worker's server listens; return the seconds since the start.

        Default time-out: ``start_timeout``, else ``timeout``. Raises :class:`ClusterTimeoutError`
        naming the workers that did not come up, or :class:`WorkerError` if one fails first.
        """
        timeout = (self.start_timeout or self.timeout) if timeout is None else timeout

        def step() -> float | None:
            self._raise_if_failed()
            if all(self.serving()):
                self._serving = True
                return self.elapsed
            return None

        return self._poll(step, timeout, lambda: self._not_serving_error(timeout), poll_interval)

    def wait(self, timeout: float | None = None, poll_interval: float = 0.1) -> list[int]:
        """Wait until every worker exits; stop the cluster and return their exit codes (all 0).

        Raises :class:`WorkerError` as soon as one worker fails (naming it, with its last log
        lines) and :class:`ClusterTimeoutError` after ``timeout`` seconds.
        """
        timeout = self.timeout if timeout is None else timeout

        def step() -> list[int] | None:
            self._raise_if_failed()
            self._check_started()
            codes = self.poll()
            if all(code == 0 for code in codes):
                self._stream_new_lines()
                self._stop()
                return [int(code) for code in codes]  # type: ignore[arg-type]  # all 0
            return None

        return self._poll(
            step, timeout, lambda: self._timeout_error("the workers did not finish", timeout),
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

        Returns the seconds since the start. Raises :class:`WorkerError` if a worker fails first
        and :class:`ClusterTimeoutError` after ``timeout``.
        """
        timeout = self.timeout if timeout is None else timeout
        regex = re.compile(pattern, re.MULTILINE)
        indices = range(len(self.processes)) if worker is None else [worker]

        def step() -> float | None:
            if any(regex.search(self.logs.read(i)) for i in indices):
                return self.elapsed
            self._raise_if_failed()
            self._check_started()
            return None

        return self._poll(
            step, timeout,
            lambda: self._timeout_error(f"no log line matched {pattern!r}", timeout),
            poll_interval,
        )

    # -------------------------------------------------------------- parts of every wait
    def _poll(
        self,
        step: Callable[[], _T | None],
        timeout: float,
        on_timeout: Callable[[], Exception],
        poll_interval: float,
    ) -> _T:
        def streamed_step() -> _T | None:
            self._stream_new_lines()
            return step()

        return poll_until(streamed_step, timeout, on_timeout, self._stop_and_stream,
                          poll_interval)

    def _stream_new_lines(self) -> None:
        if self.stream:
            self.logs.stream_new_lines()

    def _stop_and_stream(self) -> None:
        self._stop()
        self._stream_new_lines()  # the last lines the workers wrote

    def _raise_if_failed(self) -> None:
        error = worker_failure(self.poll(), self.killed, self.logs, self.elapsed)
        if error is not None:
            raise error

    def _timeout_error(self, what: str, timeout: float) -> ClusterTimeoutError:
        return timeout_error(what, timeout, self.poll(), self.logs)

    def _not_serving_error(self, timeout: float) -> ClusterTimeoutError:
        missing = [i for i, up in enumerate(self.serving()) if not up]
        what = f"worker(s) {', '.join(map(str, missing))} did not start a server on their port"
        return self._timeout_error(what, timeout)

    def _check_started(self) -> None:
        if self.start_timeout is None or self._serving or self.elapsed < self.start_timeout:
            return
        if all(self.serving()):
            self._serving = True
            return
        raise self._not_serving_error(self.start_timeout)
