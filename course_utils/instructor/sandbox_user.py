"""The sandbox users: one unprivileged user id per notebook graded at once, reserved across
grader processes, and everything they leave behind (processes, files in shared temporary
folders) removed after each notebook.

The ids are numbers with no account (``SANDBOX_UID_BASE`` and up, skipping any that has an entry
in the user database): nothing to create, on Gradescope or anywhere, and no file on the machine
belongs to them before they run. Each has a group id of the same number and no other group.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pwd
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["SANDBOX_UID_BASE", "SHARED_TMP", "SLOTS", "SandboxUser", "become_subreaper",
           "can_switch_user", "clean_shared_tmp", "hidden_folders", "kill_user", "reap_children",
           "reserve_user"]

SANDBOX_UID_BASE = 64200
SLOTS = 64
#: World-writable folders every user can write to: what a sandbox user left there is removed.
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
LOCKS = Path("/tmp/course-sandbox-locks")


@dataclass(frozen=True)
class SandboxUser:
    """One sandbox user id (its group id is the same number)."""

    uid: int

    @property
    def gid(self) -> int:
        """Its own group, of which nobody else is a member."""
        return self.uid


def can_switch_user() -> bool:
    """True where the grader can run notebooks as another user (root on Linux)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


def _lock_dir() -> Path:
    with contextlib.suppress(FileExistsError):
        LOCKS.mkdir(mode=0o700)
    info = LOCKS.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise RuntimeError(f"{LOCKS} is not a private folder of root: remove it and grade again")
    return LOCKS


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def reserve_user(wait_s: float = 600.0) -> Iterator[SandboxUser]:
    """A sandbox user no other grader on this machine uses meanwhile; emptied before and after
    (every process killed, its files in the shared temporary folders removed)."""
    folder = _lock_dir()
    deadline = time.monotonic() + wait_s
    while True:
        for uid in range(SANDBOX_UID_BASE, SANDBOX_UID_BASE + SLOTS):
            if _has_account(uid):
                continue
            handle = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue
            user = SandboxUser(uid)
            try:
                kill_user(uid)
                clean_shared_tmp(uid)
                yield user
            finally:
                kill_user(uid)
                clean_shared_tmp(uid)
                os.close(handle)  # releases the lock
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"all {SLOTS} sandbox users are busy")
        time.sleep(0.5)


def _processes_of(uid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in (uids.real, uids.effective, uids.saved) \
                and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def kill_user(uid: int, timeout: float = 30.0, reap: bool = False) -> int:
    """SIGKILL every process of ``uid`` until none is left (a process forking meanwhile
    included); return how many were killed. Raises when some survive ``timeout`` seconds.
    ``reap``: also collect this process's exited children (a child subreaper's orphans)."""
    killed = 0
    deadline = time.monotonic() + timeout
    while procs := _processes_of(uid):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed += 1
        psutil.wait_procs(procs, timeout=0.5)
        if reap:
            reap_children()
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of sandbox user {uid} survive SIGKILL: "
                               f"{[p.pid for p in procs]}")
    return killed


def reap_children() -> None:
    """Collect every exited child of this process (orphans a subreaper inherited)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def clean_shared_tmp(uid: int) -> int:
    """Remove what ``uid`` owns at the top of the shared temporary folders; return how many."""
    removed = 0
    for folder in SHARED_TMP:
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                    removed += 1
    return removed


def hidden_folders(paths: list[Path]) -> list[tuple[str, list[str]]]:
    """Folders on the way to ``paths`` that other users cannot enter, each with the entries
    the sandbox needs of it (outermost first): what ``jail.reveal_only`` shows."""
    needed: dict[str, set[str]] = {}
    for path in paths:
        path = Path(os.path.realpath(path))
        chain = [*reversed(path.parents), path]
        for parent, child in zip(chain[:-1], chain[1:], strict=True):
            with contextlib.suppress(OSError):
                if not parent.stat().st_mode & stat.S_IXOTH:
                    needed.setdefault(str(parent), set()).add(child.name)
    return [(folder, sorted(keep)) for folder, keep in
            sorted(needed.items(), key=lambda item: item[0].count("/"))]


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux); True when it worked."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False
