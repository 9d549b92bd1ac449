"""The ps column's child process: ``python -m course_utils.works_where.ps_process --out DIR``.

TensorFlow cannot stop an in-process ``tf.distribute.Server``, so the column's cluster (2
workers and 1 parameter server on localhost) runs in a process of its own, started by
:func:`course_utils.works_where.matrix.start_parameter_server`: it starts the cluster, runs every
row under ``ParameterServerStrategy``, writes ``report-ps.json`` (the cells, the column's note and
the cluster's ports) to ``--out`` and exits, and its servers and ports go with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["REPORT_NAME", "main"]


#: The report this script writes into ``--out`` (named once, in ``matrix``).
from course_utils.works_where.matrix import PS_REPORT_NAME as REPORT_NAME  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run every API under ParameterServerStrategy and write the column's report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4, help="global batches of one pass")
    parser.add_argument("--global-batch", type=int, default=16, help="examples per step")
    args = parser.parse_args(argv)
    os.environ.pop("TF_CONFIG", None)  # the cluster is this process's own, not a TF_CONFIG's

    from course_utils.quiet import quiet_tensorflow

    quiet_tensorflow()
    from course_utils.cluster import start_in_process_cluster
    from course_utils.works_where.matrix import local_strategy
    from course_utils.works_where.runner import run_column
    from course_utils.works_where.task import make_task

    strategy, replicas, note = local_strategy("parameter_server")
    job = make_task(steps=args.steps, global_batch=args.global_batch)  # the notebook's sizes
    cells = run_column("parameter_server", strategy, job, replicas)
    for row, cell in cells.items():
        print(f"{row}: {cell.status} {cell.detail}", flush=True)
    addresses = [a for tasks in start_in_process_cluster(2, 1).cluster.values() for a in tasks]
    report = {"cells": {row: cell.to_dict() for row, cell in cells.items()}, "note": note,
              "ports": [int(address.rsplit(":", 1)[1]) for address in addresses]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, REPORT_NAME), "w") as file:
        json.dump(report, file)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's clean-up: the servers cannot be stopped, and destroying the
    # functions registered on them logs one gRPC error each. The ports close with the process.
    os._exit(code)
