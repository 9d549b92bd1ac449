"""What lesson 03's exercise 1 finds in ``checkpoint_dir`` once the job has finished.

Only the chief may write there. The check's set-up audits, in every worker, the prefixes that
its ``CheckpointManager.save`` calls wrote and those of ``tf.train.Checkpoint.write`` and
``save`` (:data:`~course_utils.grading.checks.worker_scripts.SETUP`); the check then lists
the folder. A worker other than the chief that wrote there with ``tf.train.Checkpoint`` is
named, with the files, from its audit; any other file that none of the chief's checkpoints
wrote (the manager's ``checkpoint`` file, each prefix's ``.index`` and ``.data-*``) is
refused by name as another writer's (``np.save``, ``tf.io.gfile``, ``open``: no audit sees
those, so the check cannot name the worker).

Still passes: a worker other than the chief that writes, with no ``tf.train.Checkpoint``,
a file under a name the chief's checkpoints also wrote (overwriting the chief's).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["checkpoint_dir_problem"]


def _names(prefix: str, listed: Sequence[str]) -> list[str]:
    """The files of ``listed`` that a checkpoint written at ``prefix`` made (or its
    temporary folder of a write in progress)."""
    base = os.path.basename(prefix)
    return [name for name in listed
            if name == base or name.startswith((f"{base}.", f"{base}_temp"))]


def checkpoint_dir_problem(checkpoint_dir: str, audits: Sequence[dict[str, Any]]) -> str | None:
    """What is wrong with what the workers wrote into ``checkpoint_dir`` (``audits[i]``:
    worker i's audit, its ``written`` the prefixes its ``CheckpointManager.save`` calls wrote,
    its ``writes`` the ``(method, prefix)`` of its ``tf.train.Checkpoint`` writes), or None."""
    shared = os.path.realpath(checkpoint_dir)
    listed = sorted(os.listdir(shared))

    def inside(prefix: str) -> bool:
        return os.path.dirname(os.path.realpath(prefix)) == shared

    for worker, audit in enumerate(audits[1:], start=1):
        for method, prefix in audit["writes"]:
            if inside(prefix):
                found = _names(prefix, listed) or [os.path.basename(prefix)]
                return (f"worker {worker} wrote {', '.join(found)} into checkpoint_dir with "
                        f"tf.train.Checkpoint.{method}: only the chief may write there; "
                        "every other worker writes into a temporary folder of its own")
    chief = [*audits[0]["written"], *(prefix for _, prefix in audits[0]["writes"])]
    own = {"checkpoint"}.union(*(_names(p, listed) for p in chief if inside(p)))
    foreign = [name for name in listed if name not in own]
    if not foreign:
        return None
    return (f"checkpoint_dir holds {', '.join(foreign[:4])}, which none of the chief's "
            "checkpoints wrote and no worker's tf.train.Checkpoint did (another writer: "
            "np.save, tf.io.gfile, open ...; the check cannot tell which worker): only the "
            "chief's CheckpointManager writes there")
