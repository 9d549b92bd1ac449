"""Running one prepared submission under limits: a check-runner process of the grader starts a
fresh kernel (as a sandbox user when the grader is root, see ``protection``) with its own home
and temporary folder; the check runner, its kernel and everything they started are killed when
the notebook is done, the time limit (plus a grace) is over or the batch is interrupted. The
result is read from the grader's private folder only after that."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from course_utils.instructor.assemble import Prepared
from course_utils.instructor.kernel_env import PACKAGE_DIR, kernel_env
from course_utils.instructor.protection import Protection, jail_spec
from course_utils.instructor.sandbox_user import kill_user, reserve_user
from course_utils.instructor.zygote import Zygote

__all__ = ["PACKAGE_DIR", "WORKER_GRACE", "kernel_env", "kernel_zygote", "kill_process_tree",
           "run_prepared", "stop_all", "allow_runs"]

#: Extra seconds the check-runner process gets beyond the time limit before it is killed.
WORKER_GRACE = 60.0
_ACTIVE: set[subprocess.Popen[bytes]] = set()  # running check runners, killed on Ctrl-C
_ACTIVE_LOCK = threading.Lock()
_STOP = threading.Event()  # set on Ctrl-C: start no new check runner
_ZYGOTE: dict[str, Zygote | None] = {"running": None}  # the batch's kernel zygote, when ready
_SETTLED: dict[str, threading.Event | None] = {"starting": None}  # set once it serves or fails
_ZYGOTE_LOCK = threading.Lock()
ZYGOTE_WAIT_S = 120.0  # a kernel waits this long for a starting zygote, then starts fresh


@contextlib.contextmanager
def kernel_zygote(notebooks: int, protection: Protection | None) -> Iterator[None]:
    """For a batch of ``notebooks`` sandboxed notebooks (two or more), a zygote that forks
    their kernels (``zygote.py``), started in the background. A kernel asked for while it
    imports waits for it (a fresh kernel would import the same modules in the same time, on
    the same cores) and starts fresh only if the zygote fails. Stopped when the batch ends.
    ``COURSE_GRADER_ZYGOTE=0``: none."""
    wanted = (notebooks >= 2 and protection is not None and protection.sandboxed
              and os.environ.get("COURSE_GRADER_ZYGOTE", "1") != "0")
    if not wanted:
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="cu-zygote-home-"))
    try:
        zygote = Zygote(kernel_env(folder))
    except OSError:  # no zygote: every kernel starts fresh
        shutil.rmtree(folder, ignore_errors=True)
        yield
        return

    settled = threading.Event()  # the zygote serves, or never will

    def wait_until_ready() -> None:
        try:
            with contextlib.suppress(OSError, RuntimeError):
                zygote.ready()
                with _ZYGOTE_LOCK:
                    if zygote.alive() and not _STOP.is_set():
                        _ZYGOTE["running"] = zygote
        finally:
            settled.set()

    with _ZYGOTE_LOCK:
        _SETTLED["starting"] = settled
    waiter = threading.Thread(target=wait_until_ready, daemon=True)
    waiter.start()
    try:
        yield
    finally:
        zygote.stop()  # also ends the wait of a zygote still importing
        waiter.join()
        with _ZYGOTE_LOCK:
            _SETTLED["starting"] = None
        _stop_zygote()
        shutil.rmtree(folder, ignore_errors=True)


def _ready_zygote() -> str | None:
    """The socket of the batch's zygote when it runs, else None (a fresh kernel); while it
    starts, wait for it (at most ``ZYGOTE_WAIT_S``)."""
    with _ZYGOTE_LOCK:
        settled = _SETTLED["starting"]
    deadline = time.monotonic() + ZYGOTE_WAIT_S
    while settled is not None and not settled.wait(0.5):
        if _STOP.is_set() or time.monotonic() > deadline:  # Ctrl-C, or a zygote that hangs
            break
    with _ZYGOTE_LOCK:
        zygote = _ZYGOTE["running"]
        return zygote.socket if zygote is not None and zygote.alive() else None


def _stop_zygote() -> None:
    with _ZYGOTE_LOCK:
        zygote, _ZYGOTE["running"] = _ZYGOTE["running"], None
    if zygote is not None:
        zygote.stop()


def kill_process_tree(pid: int, include_root: bool = True, wait_s: float = 5.0) -> None:
    """SIGKILL every descendant of ``pid`` (and ``pid`` itself unless ``include_root`` is
    False), then wait up to ``wait_s`` for them to go; processes already gone are fine."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), *([root] if include_root else [])]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=wait_s)


def _home(job: Path, uid: int | None) -> Path:
    """The kernel's home: inside the private job folder, or (for a sandbox user) its own
    folder in /tmp that only it can enter, with ``tmp`` and ``ipc`` (the kernel's sockets)."""
    if uid is None:
        home = job / "home"
        home.mkdir()
    else:
        home = Path(tempfile.mkdtemp(prefix="cu-box-", dir="/tmp"))
    for sub in (home / "tmp", home / "ipc"):
        sub.mkdir(mode=0o700)
    if uid is not None:
        for path in (home, home / "tmp", home / "ipc"):
            os.chown(path, uid, uid)
    return home


def run_prepared(prepared: Prepared, timeout: float,
                 protection: Protection | None = None) -> dict[str, Any]:
    """Execute a prepared notebook in a check-runner process; return its result. With a
    sandboxed ``protection`` the kernel runs as a sandbox user reserved for this notebook,
    and every process of that user is gone before this returns."""
    protection = protection or Protection(False)
    if not protection.sandboxed:
        return _run(prepared, timeout, protection, None)
    with reserve_user() as user:
        return _run(prepared, timeout, protection, user.uid)


def _run(prepared: Prepared, timeout: float, protection: Protection,
         uid: int | None) -> dict[str, Any]:
    job = Path(tempfile.mkdtemp(prefix="cu-grade-"))  # the grader's only: job, result, log
    home = None
    try:
        home = _home(job, uid)
        (job / "stage").mkdir()
        result = job / "result.json"
        job_file = job / "job.json"
        job_file.write_text(json.dumps({
            "notebook": prepared.notebook, "cwd": str(home), "env": kernel_env(home),
            "timeout": timeout, "ipc_dir": str(home / "ipc"), "uid": uid,
            "jail": jail_spec(protection, uid, job / "stage"),
            "zygote": None if uid is None else _ready_zygote()}), encoding="utf-8")
        env = dict(os.environ)
        env["JUPYTER_RUNTIME_DIR"] = str(job / "runtime")  # the grader's own, private
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p)
        with (job / "worker.log").open("wb") as log, _ACTIVE_LOCK:
            if _STOP.is_set():
                return {"status": "interrupted", "cells": []}
            process = subprocess.Popen(
                [sys.executable, "-m", "course_utils.instructor.check_runner", str(job_file),
                 str(result)],
                cwd=job, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
            _ACTIVE.add(process)
        try:
            process.wait(timeout=timeout + WORKER_GRACE)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "cells": []}
        finally:
            kill_process_tree(process.pid)
            if uid is not None:
                kill_user(uid)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(process)
        if not result.exists():
            log_text = (job / "worker.log").read_text(encoding="utf-8", errors="replace")
            return {"status": f"worker failed (exit {process.returncode}): {log_text[-400:]}",
                    "cells": []}
        return json.loads(result.read_text(encoding="utf-8"))
    finally:
        if home is not None and uid is not None:
            shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(job, ignore_errors=True)


def stop_all() -> None:
    """Start no new check runner and kill the running ones with their kernels (Ctrl-C)."""
    with _ACTIVE_LOCK:
        _STOP.set()
        running = list(_ACTIVE)
    for process in running:
        kill_process_tree(process.pid)
    _stop_zygote()


def allow_runs() -> None:
    """Let check runners start again (a new batch after an interrupted one)."""
    _STOP.clear()
