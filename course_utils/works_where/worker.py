"""The multi-worker column's worker, run as ``python -m course_utils.works_where.worker --out DIR``.

Each worker of a :class:`course_utils.cluster.LocalCluster` runs it: it builds the
MultiWorkerMirroredStrategy first (from ``TF_CONFIG``), runs every row of the table under it,
and writes ``report-<index>.json`` (``{row: cell}``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main"]



def main(argv: list[str] | None = None) -> int:
    """Run every API under MultiWorkerMirroredStrategy and write this worker's report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4, help="global batches of one pass")
    parser.add_argument("--global-batch", type=int, default=16, help="examples per step")
    args = parser.parse_args(argv)

    from course_utils.cluster import task, worker_strategy
    from course_utils.quiet import quiet_tensorflow

    quiet_tensorflow()
    strategy = worker_strategy()  # first: collectives are configured at program start
    from course_utils.works_where.runner import run_column
    from course_utils.works_where.task import make_task

    _, index = task()
    job = make_task(steps=args.steps, global_batch=args.global_batch)  # the notebook's sizes
    cells = run_column("multi_worker", strategy, job, expected_replicas=2)
    for row, cell in cells.items():
        print(f"{row}: {cell.status} {cell.detail}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"report-{index}.json"), "w") as file:
        json.dump({row: cell.to_dict() for row, cell in cells.items()}, file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
