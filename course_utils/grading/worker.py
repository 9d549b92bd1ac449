"""The grader's worker: ``python -m course_utils.grading.worker JOB.json RESULT.json``.

Runs one prepared notebook (``execute_notebook``) in its own process, so the batch grader can
kill it, its kernel and everything they started when it overruns, and writes the outcome as
JSON. The parent process does the scoring; this process only executes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import nbformat
import psutil

from course_utils.grading.execute import execute_notebook

__all__ = ["main"]


def _kill_descendants() -> None:
    """Kill every process this worker started (the kernel and whatever it spawned)."""
    with contextlib.suppress(psutil.Error):
        children = psutil.Process().children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(children, timeout=5)


def main(argv: list[str]) -> int:
    """Execute the job in ``argv[0]`` and write the result to ``argv[1]``."""
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    nb = nbformat.from_dict(job["notebook"])
    try:
        outcomes, status = execute_notebook(nb, cwd=Path(job["cwd"]), env=job["env"],
                                            timeout=float(job["timeout"]),
                                            ipc_dir=job_path.parent / "ipc")
    finally:
        _kill_descendants()
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "cells": [o.to_dict() for o in outcomes]}),
                   encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
