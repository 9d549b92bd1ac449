"""An OS pipe whose read end a child process holds, for a check's write-only log: the child copies
what was written to the check once the pipe is closed, so that the check's own process holds no
descriptor to read the log with (descriptors belong to the whole process, and a learner's code
runs in it), nor can open one through the child's ``/proc/PID/fd`` (it is not dumpable: only a
process with ``CAP_SYS_PTRACE``, root's, still can; the grader's jail leaves a submission none).
The functions here, and the child's command :data:`COPY`, are bound by the logs that use them
when the course is imported (lesson 04's :mod:`~course_utils.grading.checks.coordinator_watch`,
lesson 08's :mod:`~course_utils.grading.checks.pipe_log`)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from typing import Any

__all__ = ["COPY", "MARK", "child_reader", "closer", "end", "killer", "pipe_writer", "starter"]

#: The child that holds the pipe's read end. It first makes itself not dumpable (Linux), so that
#: no other process of the user (the check's, where the learner's code runs, included) may open
#: its ``/proc/PID/fd/0``, a read end of the pipe, then says so with :data:`MARK`, and writes
#: nothing more before the pipe is closed.
MARK = b"\0"
COPY = (sys.executable, "-I", "-S", "-c",
        "import sys\n"
        "try:\n import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE\n"
        "except (OSError, AttributeError): pass\n"
        "sys.stdout.buffer.write(b'\\0'); sys.stdout.flush()\n"
        "sys.stdout.buffer.write(sys.stdin.buffer.read())")


def starter() -> Any:
    """``start(copy)``: a pipe whose read end only a child running the command ``copy`` holds
    (this process closes its own), its write end non-blocking (a full pipe, the child stopped,
    refuses a write); returns ``(write_fd, child)``. The functions it calls are bound now (at
    import). None where pipes cannot be read with select (Windows; ``os.set_blocking`` is
    missing there before Python 3.12)."""
    pipe, popen, piped, close = os.pipe, subprocess.Popen, subprocess.PIPE, os.close
    set_blocking = getattr(os, "set_blocking", None) if os.name == "posix" else None
    if set_blocking is None:
        return None

    def start(copy: tuple[str, ...]) -> tuple[int, Any]:
        read_fd, write_fd = pipe()
        try:
            child = popen(copy, stdin=read_fd, stdout=piped, close_fds=True)
        finally:
            close(read_fd)  # the child's alone now
        set_blocking(write_fd, False)  # full (a stopped child): refused, the child ended
        return write_fd, child

    return start


def closer(fd: int) -> tuple[Any, Any]:
    """``(close, current)``: ``close()`` closes ``fd`` once (a number closed twice could be
    another file's by then); ``current()`` is ``fd`` until then, None after (a write to the
    number then could land in another file)."""
    left = [fd]

    def close() -> None:
        while left:
            try:
                os.close(left.pop())
            except OSError:
                pass

    def current() -> int | None:
        return left[0] if left else None

    return close, current


def end(close: Any, child: Any) -> None:
    """Closes the pipe's write end (``close``) and ends its ``child`` (the log is lost)."""
    close()
    child.kill()
    child.wait()
    child.stdout.close()


def pipe_writer(current: Any, lost: Any, layout: str, write: Any, pack: Any) -> Any:
    """``log(*events)``: ``(kind, number)`` events into the pipe ``current()`` in one write
    (nothing comes between them; none once the watch closed it). A write the pipe refuses (its
    descriptor closed, or full: the child stopped) calls ``lost()``, which ends the child, so
    that the judge's copy is lost for good and the record differs from it: an event the watch
    could not write cannot be forged in its place afterwards."""

    def log(*events: tuple[bytes, int]) -> None:
        fd = current()
        if fd is None:
            return
        try:
            write(fd, b"".join(pack(layout, kind, number) for kind, number in events))
        except OSError:  # closed, or full (BlockingIOError)
            if current() is not None:  # not judged yet: the child is not waited for
                lost()

    return log


def killer(kill: Any, pid: int) -> Any:
    """``lost()``: ends the child ``pid`` with ``kill`` (bound at import); only called while
    the watch holds the pipe open, so before :func:`end` waited for the child (its number
    cannot be another process's by then)."""

    def lost() -> None:
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass

    return lost


def child_reader(close: Any, child: Any, layout: str, bound: dict[str, Any]) -> Any:
    """``drain()``: closes the pipe's write end (``close``), then every ``(kind, number)`` event the
    ``child`` copied from its read end (None where its copy did not end within a minute: the
    pipe held open by a copy of its descriptor; the child's exit status where it failed on its
    own, neither copying nor ended by the watch: ``sys.executable`` could not run it). Reads with
    the ``read``, ``select`` and ``clock`` given."""
    size = struct.calcsize(layout)
    read, wait, clock, unpack = bound["read"], bound["select"], bound["clock"], bound["unpack"]
    out = child.stdout.fileno()
    # Made before the learner's code runs: wait (10 s at most) for the child's MARK, so that it
    # is not dumpable by then (a mark that comes later is dropped by drain)
    marked = bool(wait([out], [], [], 10.0)[0]) and read(out, 1) == MARK

    def drain() -> list[tuple[bytes, int]] | int | None:
        close()
        data, deadline = b"", clock() + 60
        while True:
            if not wait([out], [], [], max(0.0, deadline - clock()))[0]:
                return None
            chunk = read(out, 65536)
            if not chunk:
                break
            data += chunk
        try:  # its output ended: it is exiting
            status = child.wait(timeout=max(1.0, deadline - clock()))
        except subprocess.TimeoutExpired:
            return None
        if status not in (0, -signal.SIGKILL):
            return status
        if not marked and data[:1] == MARK:
            data = data[1:]
        events = [unpack(layout, data[start:start + size])
                  for start in range(0, len(data) - size + 1, size)]
        return events + [(b"?", 0)] * (len(data) % size != 0)  # a part frame: not the watch's

    return drain
