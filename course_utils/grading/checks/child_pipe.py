"""An OS pipe whose read end a child process holds, for a check's write-only log: the child copies
what was written to the check once the pipe is closed, so that the check's own process holds no
descriptor to read the log with (descriptors belong to the whole process, and a learner's code
runs in it). The child (:data:`COPY`, spawned with ``os.posix_spawn`` bound at import, with an
empty environment) makes itself not dumpable (Linux) before it makes the pipe, and hands the check
only the write end (``SCM_RIGHTS`` over a Unix socket): the read end never exists in the check's
process, nor in a process the user may open through ``/proc/PID/fd`` or attach to, and a child a
tracer attached to first refuses to go on. At each write and when the log is judged, another
descriptor of the check's process on the pipe (a copy of the write end, or a read end brought
back) ends the child or is named. What still reaches the log: a process with ``CAP_SYS_PTRACE``
(root's, where the container gives it; the grader's jail leaves a submission none), or
``CAP_SYS_ADMIN`` until the child is undumpable (it may name the child as a message's sender,
``SCM_CREDENTIALS``: root's; the jail leaves a sandbox user none, root keeps it); one that can
rewrite the Python the child runs (``sys.executable`` and its standard library: root, or the
owner of the installation; a sandbox user cannot); and code of the check's process that moves
the descriptors (``os.dup2``) for the call and gives them to a process of its own: no check in the
same process can stop that. Until the child is undumpable, the check's process (any process
of its user) may open the child's memory for writing (``/proc/PID/mem``), and so change the
code it is about to run, or take the child's descriptors (``pidfd_getfd``): the ``prctl`` is
the first statement of the child's code, so that window is the interpreter's start-up before it
(``exec``, Python's initialisation, the import of ``ctypes``: tens of milliseconds, long enough
for a thread that watches for the child), and no check can close it (``exec`` makes a process
dumpable again, so the flag cannot be set before). Of descriptors so taken: a message sent
through the socket is not the child's (``SCM_CREDENTIALS``: the check's socket end passes
credentials from before the spawn) and leaves a pipe with no reader (the log is lost), the pipe
is not made yet, and bytes written through the standard output are added to the copy, as bytes
written to the pipe are. The functions here, and the child's command :data:`COPY`, are bound by
the logs that use them when the course is imported (lesson 04's
:mod:`~course_utils.grading.checks.coordinator_watch`)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from typing import Any

__all__ = ["COPY", "MARK", "TRACED", "child_reader", "closer", "end", "killer", "others",
           "pipe_writer", "starter"]

#: The child that holds the pipe's read end. It first makes itself not dumpable (Linux), so that
#: no other process of the user (the check's, where the learner's code runs, included) may open
#: its descriptors through ``/proc/PID/fd`` or attach to it from then on, and refuses to go on
#: (status 75, :data:`TRACED`) where a tracer attached before that; only then does it make the
#: pipe, send the write end to the check over its standard input (a Unix socket, ``SCM_RIGHTS``),
#: so that the read end never exists in another process, say so with :data:`MARK` and write
#: nothing more before the pipe is closed.
MARK = b"\0"
TRACED = 75  # the child's exit status where a tracer held it before it was undumpable
COPY = (sys.executable, "-I", "-S", "-c",
        "try:\n import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE\n"
        "except (ImportError, OSError, AttributeError): pass\n"
        "import os, socket, sys\n"
        "try:\n"
        " with open('/proc/self/status') as status:\n"
        "  traced = any(line.split()[1:] != ['0'] for line in status\n"
        "               if line.startswith('TracerPid:'))\n"
        "except OSError: traced = False\n"
        "if traced: sys.exit(75)\n"
        "read_fd, write_fd = os.pipe()\n"
        "socket.send_fds(socket.socket(fileno=0), [b'\\0'], [write_fd]); os.close(write_fd)\n"
        "sys.stdout.buffer.write(b'\\0'); sys.stdout.flush()\n"
        "sys.stdout.buffer.write(os.fdopen(read_fd, 'rb').read())")


def starter() -> Any:
    """``start(copy)``: a pipe whose read end only a child running the command ``copy`` holds
    (the child makes the pipe and hands this process its write end: see :data:`COPY`), its
    write end non-blocking (a full pipe, the child stopped, refuses a write); returns
    ``(write_fd, child)``: ``child`` has ``pid``, ``stdout``, ``returncode``, ``wait`` and
    ``kill``, as a ``Popen``'s. The child is started with ``os.posix_spawn`` and an empty
    environment (no ``LD_PRELOAD``), and the functions ``start`` calls are bound now (at import),
    C functions all: a method of ``subprocess.Popen`` or of ``socket.socket`` replaced by a
    learner's code is not called. Where the child hands no pipe within a minute (it exited: see
    :data:`TRACED`), the write end of a pipe with no reader stands in (a write to it ends the
    child: the log is lost). None where pipes cannot be read with select or there is no
    ``posix_spawn`` (Windows)."""
    spawn = getattr(os, "posix_spawn", None) if os.name == "posix" else None
    set_blocking = getattr(os, "set_blocking", None)
    if spawn is None or set_blocking is None:
        return None
    import _socket
    import select as select_module
    import stat
    import time

    pipe, close, fdopen, fstat, waitpid, kill = (os.pipe, os.close, os.fdopen, os.fstat,
                                                 os.waitpid, os.kill)
    exit_code, is_fifo, get_flags = os.waitstatus_to_exitcode, stat.S_ISFIFO, fcntl_flags()
    socketpair, recvmsg, fileno, shut, option = (
        _socket.socketpair, _socket.socket.recvmsg, _socket.socket.fileno, _socket.socket.close,
        _socket.socket.setsockopt)
    unix, stream, rights = _socket.AF_UNIX, _socket.SOCK_STREAM, _socket.SCM_RIGHTS
    credentials, pass_credentials = (getattr(_socket, "SCM_CREDENTIALS", None),
                                     getattr(_socket, "SO_PASSCRED", None))
    if credentials is None or pass_credentials is None:  # not Linux: no sender to check
        return None
    space, sol_socket = _socket.CMSG_SPACE(4) + _socket.CMSG_SPACE(12), _socket.SOL_SOCKET
    cloexec = getattr(_socket, "MSG_CMSG_CLOEXEC", 0)
    dup2_action, close_action = os.POSIX_SPAWN_DUP2, os.POSIX_SPAWN_CLOSE
    wait_readable, monotonic, sleep, from_bytes, order = (
        select_module.select, time.monotonic, time.sleep, int.from_bytes, sys.byteorder)
    no_hang, expired, sigkill = os.WNOHANG, subprocess.TimeoutExpired, signal.SIGKILL
    write_only = os.O_WRONLY

    class Child:
        """A spawned child, as much of ``subprocess.Popen`` as the logs use."""

        __slots__ = ("pid", "stdout", "returncode")

        def wait(self, timeout: float | None = None) -> int:
            if self.returncode is not None:
                return self.returncode
            deadline = None if timeout is None else monotonic() + timeout
            while True:
                pid, status = waitpid(self.pid, 0 if deadline is None else no_hang)
                if pid:
                    self.returncode = exit_code(status)
                    return self.returncode
                if monotonic() > deadline:
                    raise expired("log copier", timeout)
                sleep(0.01)

        def kill(self) -> None:
            if self.returncode is None:  # not waited for: its number is still its own
                try:
                    kill(self.pid, sigkill)
                except OSError:
                    pass

    def handed(mine: Any, pid: int) -> int | None:
        """The write end the child ``pid`` sent over ``mine`` (within a minute), or None: the
        first message must be the child's own (its sender's process, ``SCM_CREDENTIALS``, checked
        by the kernel), not one sent through a copy of the child's socket taken before it was
        undumpable."""
        if not wait_readable([mine], [], [], 60.0)[0]:
            return None
        try:
            _, ancillary, _, _ = recvmsg(mine, 1, space, cloexec)
        except OSError:
            return None
        fds = [from_bytes(data[start:start + 4], order, signed=True)
               for level, kind, data in ancillary if level == sol_socket and kind == rights
               for start in range(0, len(data) - 3, 4)]
        senders = [from_bytes(data[:4], order, signed=True)
                   for level, kind, data in ancillary
                   if level == sol_socket and kind == credentials and data[11:12]]
        for extra in fds[1:] if senders == [pid] else fds:
            close(extra)
        if not fds or senders != [pid]:
            return None
        if not is_fifo(fstat(fds[0]).st_mode) or get_flags(fds[0]) & 3 != write_only:
            close(fds[0])
            return None
        return fds[0]

    def start(copy: tuple[str, ...]) -> tuple[int, Any]:
        mine, theirs = socketpair(unix, stream)
        try:  # each message then says which process sent it
            option(mine, sol_socket, pass_credentials, 1)
        except OSError:
            shut(mine)
            shut(theirs)
            raise
        out_read, out_write = pipe()
        try:
            pid = spawn(copy[0], [*copy], {}, file_actions=[
                (dup2_action, fileno(theirs), 0), (dup2_action, out_write, 1),
                (close_action, fileno(mine)), (close_action, out_read)])
        except OSError:
            shut(mine)
            close(out_read)
            raise
        finally:
            shut(theirs)
            close(out_write)
        child = Child()
        child.pid, child.returncode, child.stdout = pid, None, fdopen(out_read, "rb", 0)
        try:
            write_fd = handed(mine, pid)
        finally:
            shut(mine)
        if write_fd is None:  # no pipe came: one with no reader stands in
            read_fd, write_fd = pipe()
            close(read_fd)
        set_blocking(write_fd, False)  # full (a stopped child): refused, the child ended
        return write_fd, child

    return start


def fcntl_flags() -> Any:
    """``flags(fd)``: its ``fcntl.F_GETFL`` flags (bound now)."""
    import fcntl

    get, query = fcntl.fcntl, fcntl.F_GETFL
    return lambda fd: get(fd, query)


def others() -> Any:
    """``held(fd)``: whether a descriptor of this process other than ``fd`` is on the same pipe
    (``/proc/self/fd``; False where there is none such to read), read with functions bound now.
    """
    listdir, readlink, fstat = os.listdir, os.readlink, os.fstat

    def held(fd: int) -> bool:
        try:
            name, names = f"pipe:[{fstat(fd).st_ino}]", listdir("/proc/self/fd")
        except OSError:
            return False
        for each in names:
            if each != f"{fd}":
                try:
                    if readlink(f"/proc/self/fd/{each}") == name:
                        return True
                except OSError:
                    pass
        return False

    return held


_HELD = others()  # bound as the default of the functions below, when they are made


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


def pipe_writer(current: Any, lost: Any, layout: str, write: Any, pack: Any,
                held: Any = _HELD) -> Any:
    """``log(*events)``: ``(kind, number)`` events into the pipe ``current()`` in one write
    (nothing comes between them; none once the watch closed it). A write the pipe refuses (its
    descriptor closed, or full: the child stopped) calls ``lost()``, which ends the child, so
    that the judge's copy is lost for good and the record differs from it: an event the watch
    could not write cannot be forged in its place afterwards. Before each write, a
    descriptor of this process other than ``fd`` on the pipe (``held(fd)``, see :func:`others`:
    a copy of the write end, or a read end taken from the child) calls ``lost()`` too."""

    def log(*events: tuple[bytes, int]) -> None:
        fd = current()
        if fd is None:
            return
        if held(fd):
            lost()
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


def child_reader(close: Any, child: Any, layout: str, bound: dict[str, Any],
                 current: Any = None, held: Any = _HELD) -> Any:
    """``drain()``: closes the pipe's write end (``close``), then every ``(kind, number)`` event the
    ``child`` copied from its read end (None where its copy did not end within a minute: the
    pipe held open by a copy of its descriptor; the child's exit status where it failed on its
    own, neither copying nor ended by the watch: ``sys.executable`` could not run it). Reads with
    the ``read``, ``select`` and ``clock`` given. None too where, when it is called, another
    descriptor of this process is on the pipe whose write end is ``current()`` (``held``, see
    :func:`others`)."""
    expired = subprocess.TimeoutExpired
    size = struct.calcsize(layout)
    read, wait, clock, unpack = bound["read"], bound["select"], bound["clock"], bound["unpack"]
    out = child.stdout.fileno()
    # Made before the learner's code runs: wait (10 s at most) for the child's MARK, so that it
    # is not dumpable by then (a mark that comes later is dropped by drain)
    marked = bool(wait([out], [], [], 10.0)[0]) and read(out, 1) == MARK

    def drain() -> list[tuple[bytes, int]] | int | None:
        fd = current() if current is not None else None
        if fd is not None and held(fd):
            close()
            return None
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
        except expired:
            return None
        if status not in (0, -signal.SIGKILL):
            return status
        if not marked and data[:1] == MARK:
            data = data[1:]
        events = [unpack(layout, data[start:start + size])
                  for start in range(0, len(data) - size + 1, size)]
        return events + [(b"?", 0)] * (len(data) % size != 0)  # a part frame: not the watch's

    return drain

