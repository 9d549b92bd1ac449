"""Lesson 05, exercise 2: a described TPU's settings judged rule by rule (a verifier).

:func:`settings_problem` takes the case's arguments and the learner's
``(per_replica_batch, steps_per_execution)`` and names the first rule of the exercise's text
that the pair breaks, each tested as the text states it and one step up or down, never by
computing the answer:

* the per-replica batch: a whole number, at least 1; times the replicas, at most
  ``max_global_batch``; a multiple of 128 where a tile of 128 fits every replica, else of 8
  where one of 8 does; and the largest such: one more tile a replica no longer fits;
* ``steps_per_execution``: a whole number, at least 1; at most the steps of one epoch of that
  global batch (``drop_remainder``), or 1 where the epoch has no whole step; the host
  round-trip shared by its steps within the accepted share of a step while one step fewer is
  not, unless the epoch's steps are all it may have: then it has them all.

Nothing here returns the answer (the package is installed for learners). A learner's copy of
the verifier driven as a search passes, as the text's rules written out by hand would: the
rules are the exercise's own words.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_utils.grading.checks.answer_reach import plain_number

__all__ = ["on_a_boundary", "settings_problem"]

#: The tiles a per-replica batch is made of, the largest first (the exercise's text).
TILES = (128, 8)


def _whole(value: Any, name: str) -> tuple[int | None, str | None]:
    """``value`` as an int (NumPy's and a scalar tensor's included, a bool not), or the
    sentence that says why not. Exact types (``plain_number``): an object's ``__index__`` run
    here, after the answer returned, could drive the rules below as a search, and did."""
    number = plain_number(value)
    if type(number) is not int:
        if type(number) is float and number.is_integer():
            return None, f"{name} should be an int, got the float {number!r} (use // or int())"
        return None, f"{name} should be an int, got {type(value).__name__}"
    if number < 1:
        return None, f"{name} is {number}: it is never fewer than 1"
    return number, None


def _batch_problem(replicas: int, most: int, batch: int) -> str | None:
    """What the per-replica ``batch`` breaks of the batch rules, or None."""
    if batch * replicas > most:
        return (f"the global batch, per_replica_batch {batch} x {replicas} replicas = "
                f"{batch * replicas}, is more than max_global_batch={most}")
    tile = next((size for size in TILES if size * replicas <= most), 1)
    if batch % tile:
        return (f"a tile of {tile} fits every replica ({tile} x {replicas} replicas <= "
                f"{most}), so per_replica_batch must be a multiple of {tile}: {batch} is not")
    if (batch + tile) * replicas <= most:
        return (f"per_replica_batch {batch} is not as many as the global batch allows: one "
                f"more tile, {batch + tile} a replica, still fits ({batch + tile} x {replicas} "
                f"= {(batch + tile) * replicas} <= max_global_batch={most})")
    return None


def _steps_problem(args: tuple[Any, ...], batch: int, steps: int) -> str | None:
    """What ``steps`` a call break of the overhead and epoch rules, or None."""
    replicas, _, host_ms, step_ms, fraction, examples = args
    epoch = examples // (batch * replicas)
    cap = max(1, epoch)
    accepted = fraction * step_ms
    if steps > cap:
        why = (f"one epoch of {examples} examples in global batches of {batch * replicas} "
               f"(drop_remainder=True) has {epoch} steps")
        return (f"steps_per_execution {steps} is more than the steps of one epoch: {why}"
                + (", and never fewer than 1" if epoch < 1 else ""))
    if host_ms / steps <= accepted:
        if steps > 1 and host_ms / (steps - 1) <= accepted:
            return (f"steps_per_execution {steps} is not the fewest: {steps - 1} steps a call "
                    f"already share the {host_ms} ms round-trip down to "
                    f"{host_ms / (steps - 1):.6g} ms a step, within the accepted "
                    f"{fraction} x {step_ms} ms = {accepted:.6g} ms")
        return None
    if steps < cap:
        return (f"steps_per_execution {steps} shares the {host_ms} ms round-trip down to "
                f"{host_ms / steps:.6g} ms a step only, more than the accepted {fraction} x "
                f"{step_ms} ms = {accepted:.6g} ms, and one epoch has {epoch} steps: more "
                "steps a call fit")
    return None


def settings_problem(args: tuple[Any, ...], got: Any) -> str | None:
    """The first rule of exercise 2 that ``got`` breaks for the TPU described by ``args``
    (``replicas, max_global_batch, host_overhead_ms, step_ms, max_overhead_fraction,
    num_examples``), as a sentence naming it; None when it keeps them all."""
    if type(got) not in (tuple, list, np.ndarray) or getattr(got, "ndim", 1) != 1 or len(
            got) != 2:  # exact types: no code of the learner's runs here
        return (f"expected a pair (per_replica_batch, steps_per_execution), got "
                f"{type(got).__name__}")
    batch, problem = _whole(got[0], "per_replica_batch (result[0])")
    if problem is None:
        problem = _batch_problem(args[0], args[1], batch)
    if problem is not None:
        return problem
    steps, problem = _whole(got[1], "steps_per_execution (result[1])")
    return problem if problem is not None else _steps_problem(args, batch, steps)


def on_a_boundary(host_overhead_ms: float, step_ms: float, fraction: float) -> bool:
    """True when the overhead rule lands on a whole number of steps, where float rounding
    can decide between two answers: the random cases avoid them (two fixed ones do not)."""
    ratio = host_overhead_ms / (fraction * step_ms)
    return abs(ratio - round(ratio)) < 1e-6
