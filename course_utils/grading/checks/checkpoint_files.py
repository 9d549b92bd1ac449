"""What lesson 03's exercise 1 finds in ``checkpoint_dir`` once the job has finished.

Only the chief may write there. The check's set-up audits, in every worker, the prefixes that
its ``CheckpointManager.save`` calls wrote and those of ``tf.train.Checkpoint.write`` and
``save`` (:data:`~course_utils.grading.checks.worker_scripts.SETUP`); the check then lists
the folder. A worker other than the chief that wrote there with ``tf.train.Checkpoint`` is
named, with the files, from its audit; any other file that none of the chief's checkpoints
wrote (the manager's ``checkpoint`` file, each prefix's ``.index`` and ``.data-*``) is
refused by name as another writer's (``np.save``, ``tf.io.gfile``, ``open``: no audit sees
those, so the check cannot name the worker).

Every other worker saves too, the same checkpoint (a save may read a variable through a
collective that every worker must join: ``collective_all_reduce_strategy.py`` lines 78-82):
the set-up reads back what each ``CheckpointManager.save`` held, and the check compares each
worker's save with the chief's after the same step (r03c L1: an empty ``tf.train.Checkpoint()``
saved by the others passed when only the calls were counted).

Still passes: a worker other than the chief that writes, with no ``tf.train.Checkpoint``,
a file under a name the chief's checkpoints also wrote (overwriting the chief's).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["checkpoint_dir_problem", "saved_contents_problem"]


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


def _compared(held: dict[str, Any]) -> dict[str, Any]:
    """What a save held, less its object graph and its save counter (a worker may count its
    saves with a Checkpoint made afresh for each)."""
    return {name: value for name, value in held.items()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith("save_counter/")}


def saved_contents_problem(audits: Sequence[dict[str, Any]]) -> str | None:
    """What another worker's save held that the chief's save after the same step did not
    (``audits[i]["held"][k]``: worker i's k-th save, each variable's (shape, sum as text);
    the saves already checked to come after the same steps), or None."""
    chief = audits[0]
    for worker, audit in enumerate(audits[1:], start=1):
        for after, own, theirs in zip(chief["saved_after"], chief["held"], audit["held"],
                                      strict=True):
            own, theirs = _compared(own), _compared(theirs)
            if set(theirs) != set(own):
                differ = sorted(set(own) ^ set(theirs))
                return (f"worker {worker}'s save after step {after} held {len(theirs)} "
                        f"variables, the chief's {len(own)} (not in both: "
                        f"{', '.join(differ[:2])}): every worker saves the same "
                        "tf.train.Checkpoint of the model and optimizer, the others into a "
                        "temporary folder (a save may read a variable through a collective "
                        "that every worker must join)")
            differ = [name for name, (shape, total) in own.items() if theirs[name][0] != shape
                      or (None in (total, theirs[name][1]) and total != theirs[name][1])
                      or (None not in (total, theirs[name][1]) and not np.isclose(
                          float(total), float(theirs[name][1]), rtol=1e-6, atol=1e-6,
                          equal_nan=True))]
            if differ:
                return (f"worker {worker}'s save after step {after} held other values than "
                        f"the chief's ({', '.join(differ[:2])}): every worker saves the "
                        "model and optimizer it trains, not a copy")
    return None
