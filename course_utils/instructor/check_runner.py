"""The grader's worker: ``python -m course_utils.instructor.check_runner JOB.json RESULT.json``.

Runs one prepared notebook (``execute_notebook``) in its own process, so the batch grader can
kill it, its kernel and everything they started when it overruns, and writes the outcome as
JSON. The parent process does the scoring; this process only executes. It is a child
subreaper: a process the notebook detaches (fork, ``setsid``, fork again) becomes its child
rather than init's, and is killed with the rest (as are all processes of the sandbox user)
before the result is written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import psutil

from course_utils.instructor.execute import execute_notebook
from course_utils.instructor.sandbox import kill_process_tree
from course_utils.instructor.sandbox_user import become_subreaper, kill_user, reap_children

__all__ = ["kill_everything", "main"]

def kill_everything(uid: int | None, rounds: int = 50) -> None:
    """Kill every descendant of this process (and every process of ``uid``) until none is
    left, collecting the exited ones."""
    for _ in range(rounds):
        if uid is not None:
            kill_user(uid, reap=True)
        kill_process_tree(os.getpid(), include_root=False, wait_s=1.0)
        reap_children()
        alive = [p for p in psutil.Process().children(recursive=True)
                 if p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return


def main(argv: list[str]) -> int:
    """Execute the job in ``argv[0]`` and write the result to ``argv[1]``."""
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    become_subreaper()
    nb = nbformat.from_dict(job["notebook"])
    try:
        outcomes, status = execute_notebook(nb, cwd=Path(job["cwd"]), env=job["env"],
                                            timeout=float(job["timeout"]),
                                            ipc_dir=Path(job["ipc_dir"]), jail=job["jail"],
                                            zygote=job.get("zygote"))
    finally:
        kill_everything(job.get("uid"))  # the kernel, its children and anything detached
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "cells": [o.to_dict() for o in outcomes]}),
                   encoding="utf-8")
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
