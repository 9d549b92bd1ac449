"""What a failed or hung local cluster raises, with each worker's state and last log lines."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .logs import WorkerLogs, indent
from .processes import describe_exit

__all__ = ["ClusterTimeoutError", "WorkerError", "timeout_error", "worker_failure"]


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
    parts = [f"worker {first} {how} ({describe_exit(code)}). Last lines of its log:"]
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
