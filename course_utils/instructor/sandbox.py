"""Running one prepared submission under limits: a fresh kernel in a check-runner process, in
a private temporary folder, with the grader's environment, killed with everything it started
when the time limit (plus a grace) is over or the batch is interrupted."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

import course_utils
from course_utils.grading.framework import STRICT_ENV
from course_utils.instructor.assemble import Prepared

__all__ = ["PACKAGE_DIR", "WORKER_GRACE", "kernel_env", "kill_process_tree", "run_prepared",
           "stop_all", "allow_runs"]

#: Extra seconds the check-runner process gets beyond the time limit before it is killed.
WORKER_GRACE = 60.0
PACKAGE_DIR = Path(course_utils.__file__).resolve().parent
_ACTIVE: set[subprocess.Popen[bytes]] = set()  # running check runners, killed on Ctrl-C
_ACTIVE_LOCK = threading.Lock()
_STOP = threading.Event()  # set on Ctrl-C: start no new check runner


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


def kernel_env(workdir: Path) -> dict[str, str]:
    """The environment of a grading kernel: strict checks, quiet TensorFlow, no user config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "COURSE_"))}
    root = str(PACKAGE_DIR.parent)
    env.update({
        STRICT_ENV: "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p),
        "IPYTHONDIR": str(workdir / ".ipython"),
        "MPLCONFIGDIR": str(workdir / ".matplotlib"),
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def run_prepared(prepared: Prepared, timeout: float) -> dict[str, Any]:
    """Execute a prepared notebook in a worker process; return the worker's result."""
    tmp = Path(tempfile.mkdtemp(prefix="cu-grade-"))
    try:
        work = tmp / "work"
        work.mkdir()
        job, result = tmp / "job.json", tmp / "result.json"
        job.write_text(json.dumps({"notebook": prepared.notebook, "cwd": str(work),
                                   "env": kernel_env(tmp), "timeout": timeout}),
                       encoding="utf-8")
        env = dict(os.environ)
        env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")  # connection files: private, writable
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p)
        with (tmp / "worker.log").open("wb") as log, _ACTIVE_LOCK:
            if _STOP.is_set():
                return {"status": "interrupted", "cells": []}
            process = subprocess.Popen(
                [sys.executable, "-m", "course_utils.instructor.check_runner", str(job),
                 str(result)],
                cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
            _ACTIVE.add(process)
        try:
            process.wait(timeout=timeout + WORKER_GRACE)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "cells": []}
        finally:
            kill_process_tree(process.pid)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(process)
        if not result.exists():
            log_text = (tmp / "worker.log").read_text(encoding="utf-8", errors="replace")
            return {"status": f"worker failed (exit {process.returncode}): {log_text[-400:]}",
                    "cells": []}
        return json.loads(result.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)




def stop_all() -> None:
    """Start no new check runner and kill the running ones with their kernels (Ctrl-C)."""
    with _ACTIVE_LOCK:
        _STOP.set()
        running = list(_ACTIVE)
    for process in running:
        kill_process_tree(process.pid)


def allow_runs() -> None:
    """Let check runners start again (a new batch after an interrupted one)."""
    _STOP.clear()
