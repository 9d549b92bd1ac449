"""What grading protects, decided once per batch: as root, notebooks run as sandbox users, the
grader's folders (submissions, solutions, gradebook, feedback, results) are made private to
their owner, and a probe run as a sandbox user confirms that it can import the course, cannot
write to it and cannot read those folders. Otherwise one line says what is not protected."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.instructor.limits import Limits
from course_utils.instructor.sandbox_user import can_switch_user, hidden_folders, reserve_user

__all__ = ["JAIL", "NOT_ROOT", "Protection", "SandboxError", "jail_spec", "make_private", "protect",
           "python_paths"]

JAIL = Path(__file__).resolve().with_name("jail.py")
NOT_ROOT = ("not root: submissions run with your own rights, so they can read your files, "
            "change the gradebook and leave processes behind; run the grader as root (a "
            "container, CI, Gradescope) to sandbox them")
_PROBE = """
import json, os, sys
args = json.loads(sys.argv[1])
import course_utils
found = {"package": os.path.dirname(os.path.realpath(course_utils.__file__)), "writable": [],
         "readable": [p for p in args["private"] if os.access(p, os.R_OK)]}
for top in args["package"]:
    for folder, dirs, files in os.walk(top):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            if os.access(path, os.W_OK):
                found["writable"].append(path)
for path in args["shared"]:
    if os.access(path, os.W_OK):
        found["writable"].append(path)
print(json.dumps(found))
"""


@dataclass(frozen=True)
class Protection:
    """How a batch runs its notebooks: ``sandboxed`` as sandbox users, else as the grader."""

    sandboxed: bool
    limits: Limits = field(default_factory=Limits)
    note: str = ""  # when not sandboxed: what is not protected, in one line
    hidden: tuple[tuple[str, tuple[str, ...]], ...] = ()  # folders hidden from the sandbox


def python_paths() -> list[Path]:
    """What a kernel must reach: this Python, its installation and environment, the course."""
    from course_utils.instructor.kernel_env import PACKAGE_DIR

    return [Path(sys.executable), Path(sys.base_prefix), Path(sys.prefix), PACKAGE_DIR]


def jail_spec(protection: Protection, uid: int | None, stage: Path) -> dict:
    """The spec ``jail.py`` applies before it starts a kernel."""
    spec: dict = {"rlimits": protection.limits.rlimits(own_user=uid is not None)}
    if uid is not None:
        spec.update(uid=uid, gid=uid, hidden=[list(h) for h in protection.hidden],
                    stage=str(stage))
    return spec


def make_private(paths: list[Path]) -> None:
    """Take group and other permissions off each existing path (a folder: its whole content
    becomes unreachable to other users)."""
    for path in paths:  # a read-only mount stays as it is: the probe then tells
        with contextlib.suppress(OSError):
            mode = path.stat().st_mode
            if mode & 0o077:
                path.chmod(stat.S_IMODE(mode) & 0o700)


def _probe(protection: Protection, private: list[Path]) -> dict:
    from course_utils.instructor.kernel_env import PACKAGE_DIR, kernel_env

    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    args = {"private": [str(p) for p in private if p.exists()], "package": [str(PACKAGE_DIR)],
            "shared": [str(PACKAGE_DIR.parent), sys.prefix, *site]}
    with reserve_user() as user, tempfile.TemporaryDirectory(prefix="cu-probe-") as job:
        stage = Path(job) / "stage"
        stage.mkdir()
        home = Path(tempfile.mkdtemp(prefix="cu-box-", dir="/tmp"))
        try:
            os.chown(home, user.uid, user.gid)
            spec = jail_spec(protection, user.uid, stage)
            command = [sys.executable, "-I", str(JAIL), json.dumps(spec), "--", sys.executable,
                       "-c", _PROBE, json.dumps(args)]
            run = subprocess.run(command, env=kernel_env(home), cwd=home, capture_output=True,
                                 text=True, timeout=120)
        finally:
            import shutil

            shutil.rmtree(home, ignore_errors=True)
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip().splitlines()[-1] if run.stderr.strip()
                           else f"exit {run.returncode}")
    return json.loads(run.stdout.strip().splitlines()[-1])


class SandboxError(RuntimeError):
    """The sandbox would not protect what it must: grading does not start."""


def protect(private: list[Path], limits: Limits | None = None) -> Protection:
    """The protection of a batch whose grader-owned paths are ``private``; as root, those
    paths are made private first and a probe checks the sandbox. Raises SandboxError when a
    sandbox user could write to the course or read a private path."""
    limits = limits or Limits()
    if not can_switch_user():
        return Protection(False, limits, NOT_ROOT)
    make_private(private)
    hidden = tuple((folder, tuple(keep)) for folder, keep in hidden_folders(python_paths()))
    protection = Protection(True, limits, hidden=hidden)
    try:
        found = _probe(protection, private)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as error:
        return Protection(False, limits, f"root, but a sandbox user cannot run this Python and "
                          f"the course ({error}); submissions run as root, unprotected: install "
                          "them where other users can read them")
    from course_utils.instructor.kernel_env import PACKAGE_DIR

    if found["package"] != str(PACKAGE_DIR.resolve()):
        raise SandboxError(f"the sandbox imports course_utils from {found['package']}, not "
                           f"{PACKAGE_DIR}")
    if found["writable"]:
        raise SandboxError(f"the sandbox user could change the course: {found['writable'][0]} "
                           f"(and {len(found['writable']) - 1} more) is writable by other "
                           "users; run chmod -R o-w on it")
    if found["readable"]:
        raise SandboxError(f"the sandbox user could read {found['readable'][0]}")
    return protection
