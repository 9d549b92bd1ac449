"""Start a command as the sandbox user: ``python -I jail.py SPEC_JSON -- COMMAND...``.

Run by the grader as root (standard library only, no package import). In order: when the spec
names hidden folders, a private mount namespace in which each is replaced by an empty folder
holding only the entries the sandbox needs (``/root`` with only ``.pyenv``, say, when Python is
installed there: nothing else of ``/root`` is visible); resource limits; no new privileges
(set-user-id programs such as ``su`` or ``crontab`` gain nothing); then the sandbox's user and
group with no supplementary groups, a private umask, and ``exec`` of the command. Without a
``uid`` it only sets the limits (the grader is not root), and, run as root (a sandbox user could
not run the course: submissions then run as root), takes ``CAP_SYS_PTRACE`` away from the
command (its bounding set too, so that no ``exec`` gets it back): a process without it cannot
open another's ``/proc/PID/fd`` or memory once that one made itself not dumpable, as the checks'
log copiers and forked copies do, even one of the same user.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

__all__ = ["confine", "drop_ptrace", "main", "reveal_only"]

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_READ, PR_CAPBSET_DROP, CAP_SYS_PTRACE = 23, 24, 19
_CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 4096, 16384, 1 << 18, 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def reveal_only(hidden: list[tuple[str, list[str]]], stage: str) -> None:
    """In a new mount namespace, show of each hidden folder only the named entries."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for n, (folder, keep) in enumerate(hidden):
        staged = []
        for k, name in enumerate(keep):
            place = os.path.join(stage, f"{n}-{k}")
            original = os.path.join(folder, name)
            if os.path.isdir(original):
                os.mkdir(place, 0o700)
            else:
                open(place, "w").close()
            _mount(original, place, None, MS_BIND | MS_REC)
            staged.append((place, os.path.join(folder, name), os.path.isdir(original)))
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        for place, target, is_dir in staged:
            if is_dir:
                os.mkdir(target, 0o755)
            else:
                open(target, "w").close()
            _mount(place, target, None, MS_BIND | MS_REC)
            _check(_libc.umount2(place.encode(), MNT_DETACH), f"umount {place}")


def drop_ptrace() -> None:
    """Take ``CAP_SYS_PTRACE`` out of this process's bounding, effective, permitted and
    inheritable sets (the ambient set follows the permitted one)."""
    _check(_libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0), "prctl")
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: capabilities 0-31, 32-63
    _check(_libc.capget(header, data), "capget")
    for index in range(3):
        data[index] &= ~(1 << CAP_SYS_PTRACE)
    _check(_libc.capset(header, data), "capset")


def confine(spec: dict) -> None:
    """Apply ``spec`` to this process: hidden folders, limits, then the sandbox's user."""
    if spec.get("hidden"):
        reveal_only([(f, list(k)) for f, k in spec["hidden"]], spec["stage"])
    for name, value in spec.get("rlimits", {}).items():  # "data": RLIMIT_DATA, ...
        which = getattr(resource, name if name.startswith("RLIMIT_") else f"RLIMIT_{name.upper()}")
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    if spec.get("uid") is not None:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
        os.umask(0o077)
    elif (sys.platform.startswith("linux") and os.geteuid() == 0
          and _libc.prctl(PR_CAPBSET_READ, CAP_SYS_PTRACE, 0, 0, 0) == 1):
        # in the bounding set (a container that never had it has nothing to drop)
        try:
            drop_ptrace()
        except OSError as error:  # a container without CAP_SETPCAP: grade all the same
            print(f"warning: the submission keeps CAP_SYS_PTRACE ({error})", file=sys.stderr)


def main(argv: list[str]) -> None:
    """Apply the spec in ``argv[0]`` and exec the command after ``--``."""
    confine(json.loads(argv[0]))
    command = argv[argv.index("--") + 1:]
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
