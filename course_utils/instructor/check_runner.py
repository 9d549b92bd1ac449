"""The grader's worker: ``python -m course_utils.instructor.check_runner JOB.json RESULT.json``.

Runs one prepared notebook (``execute_notebook``) in its own process, so the batch grader can
kill it, its kernel and everything they started when it overruns, and writes the outcome as
JSON. The parent process does the scoring; this process only executes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat

from course_utils.instructor.execute import execute_notebook
from course_utils.instructor.sandbox import kill_process_tree

__all__ = ["main"]


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
        kill_process_tree(os.getpid(), include_root=False)  # the kernel and its children
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "cells": [o.to_dict() for o in outcomes]}),
                   encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
