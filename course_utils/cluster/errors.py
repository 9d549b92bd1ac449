"""What a failed or hung local cluster raises, with each worker's state and last log lines."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from .logs import WorkerLogs, indent
from .processes import describe_exit

__all__ = ["ClusterTimeoutError", "WorkerError", "error_summary", "timeout_error",
           "worker_failure"]

#: A Python exception's last line: ``module.path.SomeError: message``.
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit)): ?(.*)$")


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


def error_summary(log: str, limit: int = 300) -> str | None:
    """The exception a worker's log ends with, in one line (``SomeError: message``), or None.

    TensorFlow's graph errors say only "Graph execution error:" on that line and print the
    op's own message last, after the frames of the node's definition: that message is used.
    """
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        found = _EXCEPTION_LINE.match(lines[index])
        if found:
            name, message = found.groups()
            if message.endswith("execution error:") and index < len(lines) - 1:
                message = lines[-1]
            summary = f"{name}: {message}"
            return summary if len(summary) <= limit else summary[:limit - 1] + "…"
    return None


def worker_failure(
    codes: Sequence[int | None], killed: Collection[int], logs: WorkerLogs, elapsed: float
) -> WorkerError | None:
    """The :class:`WorkerError` for the first failed worker (one killed on purpose first), if any.

    ``codes`` are the workers' exit codes (None while running); ``killed`` the workers that
    were killed on purpose.
    """
    failed = [(i, code) for i, code in enumerate(codes) if code is not None and code != 0]
    if not failed:
        return None
    first, code = next(((i, c) for i, c in failed if i in killed), failed[0])
    how = "was killed on purpose" if first in killed else "failed"
    summary = error_summary(logs.read(first)) if first not in killed else None
    said = f": {summary}" if summary else ""
    parts = [f"worker {first} {how} ({describe_exit(code)}){said}. Last lines of its log:"]
    parts.append(indent(logs.tail(first)))
    for other, other_code in enumerate(codes):
        if other != first:
            parts.append(f"worker {other} ({describe_exit(other_code)}), last lines:")
            parts.append(indent(logs.tail(other, 5)))
    parts.append(f"Full logs: {logs.log_dir}")
    return WorkerError("\n".join(parts), first, code, logs.tail(first), elapsed)


def timeout_error(
    what: str, timeout: float, codes: Sequence[int | None], logs: WorkerLogs
) -> ClusterTimeoutError:
    """A :class:`ClusterTimeoutError` saying ``what`` did not happen, with every worker's tail."""
    parts = [f"{what} within {timeout:.0f} s; stopping the cluster."]
    for index, code in enumerate(codes):
        parts.append(f"worker {index} ({describe_exit(code)}), last lines:")
        parts.append(indent(logs.tail(index, 10)))
    parts.append(f"Full logs: {logs.log_dir}")
    return ClusterTimeoutError("\n".join(parts))
