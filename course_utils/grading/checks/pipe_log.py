"""A write-only log for lesson 08, exercise 1: records go into an OS pipe whose read end only
the check holds, so the model the learner receives carries no readable record of its steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PipeLog", "pipe_log"]


class PipeLog:
    """A write-only log: records go into an OS pipe whose read end only the check holds.

    The check's model writes when its steps waited and when its ``fit`` returned; the learner's
    function receives the model (and so this object), never the records: reading them back
    needs the read end, which no closure, attribute or default of the model holds."""

    _RECORD = "<cdd"  # kind (b"s" a step's wait, b"f" a fit's return), start, end

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, kind: bytes, start: float, end: float = 0.0) -> None:
        import os
        import struct

        os.write(self._fd, struct.pack(self._RECORD, kind, start, end))


def pipe_log() -> tuple[PipeLog, Callable[[], dict[str, list[Any]]], Callable[[], None]]:
    """``(log, read, close)``: the model's write-only log, the check's reader of every record
    written so far (``{"steps": [(start, end)], "fit_ends": [t]}``), and a closer of both ends."""
    import os
    import struct

    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    size = struct.calcsize(PipeLog._RECORD)
    records: dict[str, list[Any]] = {"steps": [], "fit_ends": []}
    pending = bytearray()

    def read() -> dict[str, list[Any]]:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            pending.extend(chunk)
        while len(pending) >= size:
            kind, start, end = struct.unpack(PipeLog._RECORD, bytes(pending[:size]))
            del pending[:size]
            if kind == b"s":
                records["steps"].append((start, end))
            else:
                records["fit_ends"].append(start)
        return {name: list(values) for name, values in records.items()}

    def close() -> None:
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    return PipeLog(write_fd), read, close
