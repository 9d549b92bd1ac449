"""The learner's function called in a copy of this process made before a check draws its cases.

A function called in the checker's own process can reach whatever the checker holds: its
frames (``sys._getframe``, a traceback's ``tb_frame.f_back``), the closures of what it is given
and every object through the garbage collector, however its names are spelt. A
:class:`ForkedCall` forks the process *before* the check draws its inputs and their expected
answers, and calls the function in that copy: the copy holds the notebook as it was (its
globals, the learner's helpers, the modules imported) and none of the answers, which do not
exist yet when it is made. Only plain Python runs in the copy (no TensorFlow: a forked
TensorFlow runtime may hang), so it suits checks of pure functions (lesson 03's diagnosis).
Where ``os.fork`` is missing (Windows) the function is called in this process.

The copy is made before any guard starts; a function guarded there (``refusals.refusing``,
``step_waits.CodesRun``) that forks again, or starts a process or a thread the guard cannot
watch, to run a helper out of its sight, is named by that guard in the copy
(``call_guard``), and the parent receives the message as a :class:`ForkedCallError`.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
import types
from collections.abc import Iterable
from typing import Any

__all__ = ["ForkedCall", "ForkedCallError"]


def _set_dumpable(dumpable: bool) -> bool:
    """Linux's ``prctl(PR_SET_DUMPABLE)`` on this process; returns whether it was dumpable.

    A process that is not dumpable cannot be read by another process of the same user through
    ``/proc/PID/mem`` or ``process_vm_readv`` (ptrace access mode), so the copy cannot search
    this process's memory for the answers of the cases drawn after the fork. A process with
    ``CAP_SYS_PTRACE`` (root) still can: grade as an unprivileged user. Elsewhere: nothing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    was = prctl(3, 0, 0, 0, 0) == 1           # PR_GET_DUMPABLE
    prctl(4, int(dumpable), 0, 0, 0)          # PR_SET_DUMPABLE
    return was


class ForkedCallError(RuntimeError):
    """The learner's function raised (or did not return) in the forked copy."""


def _send(fd: int, value: Any) -> None:
    data = pickle.dumps(value)
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _receive(fd: int, deadline: float | None) -> Any:
    def read(size: int) -> bytes:
        chunks = b""
        while len(chunks) < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(fd, size - len(chunks))
            if not chunk:
                raise EOFError
            chunks += chunk
        return chunks

    (size,) = struct.unpack("<Q", read(8))
    return pickle.loads(read(size))


def _serve(fn: Any, requests: int, replies: int) -> None:  # in the copy; never returns
    try:
        printed = io.StringIO()
        sys.stdout = sys.stderr = printed          # the notebook's streams stay the parent's
        while True:
            try:
                args = _receive(requests, None)
            except EOFError:
                break
            printed.seek(0)
            printed.truncate()
            try:
                result = fn(*args)
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                lines = traceback.format_exception(error)[-3:]
                reply: tuple[Any, ...] = ("error", type(error).__name__, str(error),
                                          "".join(lines))
            else:
                try:
                    pickle.dumps(result)
                    reply = ("ok", result)
                except Exception:  # noqa: BLE001 - sent as its repr
                    reply = ("ok", repr(result))
            _send(replies, (*reply, printed.getvalue()))
    finally:
        os._exit(0)


class ForkedCall:
    """``fn`` called in a copy of this process forked now (see the module docstring).

    Use as a context manager; calling the object calls ``fn`` in the copy with picklable
    arguments and returns its (picklable) result, or raises :class:`ForkedCallError` with the
    function's own error, or after ``timeout_s`` seconds without an answer. With ``callers``
    (code objects), a call from any other code (the caller's frame's code, by identity) is
    refused with ``refusal`` before anything reaches the copy.
    """

    def __init__(self, fn: Any, timeout_s: float = 60.0, *,
                 callers: Iterable[types.CodeType] | None = None, refusal: str = "") -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        # who may call: the code objects themselves (identity), however reached; None: anyone
        self.callers = None if callers is None else frozenset(callers)
        self.refusal = refusal
        self.pid = 0
        self.local = not hasattr(os, "fork")
        if self.local:
            return
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(self._requests)
            os.close(self._replies)
            _serve(fn, requests_read, replies_write)
        self.pid = pid
        os.close(requests_read)
        os.close(replies_write)
        self._dumpable = _set_dumpable(False)   # the copy cannot read this process's memory

    def __call__(self, *args: Any) -> Any:
        if self.callers is not None and sys._getframe(1).f_code not in self.callers:
            raise ForkedCallError(self.refusal or "only its own callers may call it")
        if self.local:
            return self.fn(*args)
        if not self.pid:
            raise ForkedCallError("its process was ended by an earlier call")
        try:
            _send(self._requests, args)
            reply = _receive(self._replies, time.monotonic() + self.timeout_s)
        except TimeoutError:
            self.close()
            raise ForkedCallError(f"it returned nothing within {self.timeout_s:g} s") from None
        except (EOFError, BrokenPipeError, OSError):
            self.close()
            raise ForkedCallError("it ended the process it ran in (os._exit, or a crash)")\
                from None
        *result, printed = reply
        if printed:
            print(printed, end="")
        if result[0] == "ok":
            return result[1]
        _, kind, message, where = result
        raise ForkedCallError(f"{kind}: {message}" + (f"\n{where}" if where else ""))

    def close(self) -> None:
        """End the copy (closing its pipe; killed if it does not end at once)."""
        if not self.pid:
            return
        if self._dumpable:
            _set_dumpable(True)
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        pid, self.pid = self.pid, 0
        for _ in range(50):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    def __enter__(self) -> ForkedCall:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
