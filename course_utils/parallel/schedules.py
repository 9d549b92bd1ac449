"""Pipeline schedules as data: GPipe and 1F1B, their time slots, bubble and in-flight activations.

A schedule is first an **order** per stage: the forward ("F") and backward ("B") passes of the
micro-batches in the order that stage runs them. ``schedule_from_orders`` turns orders into time
slots (every pass takes one slot; a pass starts as soon as its stage is free and its inputs are
ready): a forward pass needs the previous stage's forward of the same micro-batch, a backward
pass needs the next stage's backward (the last stage: its own forward). From the slots follow the
**bubble** (idle cells over all cells) and the **activations in flight**: on each stage, the
micro-batches forwarded but not yet backwarded, whose activations the stage must keep.

- GPipe (Huang et al., 2019): every forward, then every backward. Stage 0 keeps all ``M``.
- 1F1B (PipeDream-Flush, Narayanan et al., 2021): stage ``s`` runs ``K − 1 − s`` warm-up
  forwards, then alternates one forward and one backward, then drains. Same slots, at most
  ``K − s`` micro-batches in flight on stage ``s``.

Pure Python (no TensorFlow): the lesson, the widget and the exercise checks share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Task", "bubble_fraction", "check_orders", "gpipe_orders", "gpipe_schedule",
           "interleaved_bubble_fraction", "one_f_one_b_orders", "one_f_one_b_schedule",
           "peak_in_flight", "schedule_bubble", "schedule_from_orders"]

Pass = tuple[str, int]  # ("F", micro_batch) or ("B", micro_batch)


@dataclass(frozen=True)
class Task:
    """A schedule cell: in ``slot``, ``stage`` runs ``phase`` ("F"/"B") of ``micro_batch``."""

    slot: int
    stage: int
    micro_batch: int
    phase: str


def _validate(num_stages: int, num_micro_batches: int) -> None:
    if num_stages < 1 or num_micro_batches < 1:
        raise ValueError("num_stages and num_micro_batches must be at least 1, got "
                         f"{num_stages} and {num_micro_batches}")


def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    """GPipe's (and 1F1B's) idle fraction of each stage: (K − 1) / (M + K − 1)."""
    _validate(num_stages, num_micro_batches)
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def interleaved_bubble_fraction(num_stages: int, num_micro_batches: int, chunks: int) -> float:
    """Idle fraction with ``chunks`` (v) model chunks per device: (K − 1) / (v·M + K − 1).

    Narayanan et al. (2021) state it as bubble time over ideal time, (K − 1) / (v·M): each of
    the K − 1 fill and drain steps lasts 1/v of a whole stage's pass.
    """
    _validate(num_stages, num_micro_batches)
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    return (num_stages - 1) / (chunks * num_micro_batches + num_stages - 1)


def gpipe_orders(num_stages: int, num_micro_batches: int) -> list[list[Pass]]:
    """GPipe's order on every stage: all forwards, then all backwards."""
    _validate(num_stages, num_micro_batches)
    one = [("F", b) for b in range(num_micro_batches)] + [
        ("B", b) for b in range(num_micro_batches)]
    return [list(one) for _ in range(num_stages)]


def one_f_one_b_orders(num_stages: int, num_micro_batches: int) -> list[list[Pass]]:
    """1F1B's order: ``K − 1 − s`` warm-up forwards, then one forward, one backward, then drain."""
    _validate(num_stages, num_micro_batches)
    orders = []
    for stage in range(num_stages):
        warm_up = min(num_stages - 1 - stage, num_micro_batches)
        order: list[Pass] = [("F", b) for b in range(warm_up)]
        backward = 0
        for forward in range(warm_up, num_micro_batches):
            order += [("F", forward), ("B", backward)]
            backward += 1
        order += [("B", b) for b in range(backward, num_micro_batches)]
        orders.append(order)
    return orders


def check_orders(orders: Sequence[Sequence[Pass]], num_micro_batches: int) -> None:
    """Raise ValueError unless every stage runs each micro-batch's F and B exactly once."""
    wanted = sorted((phase, b) for phase in "FB" for b in range(num_micro_batches))
    for stage, order in enumerate(orders):
        try:
            got = sorted((str(phase), int(b)) for phase, b in order)
        except (TypeError, ValueError) as error:
            raise ValueError(f"stage {stage}: every entry must be a pair like ('F', 0), "
                             f"({error})") from None
        if got != wanted:
            raise ValueError(f"stage {stage} must run ('F', b) and ('B', b) once for every "
                             f"micro-batch b in 0..{num_micro_batches - 1}; got {list(order)}")


def schedule_from_orders(orders: Sequence[Sequence[Pass]]) -> list[Task]:
    """Time slots of per-stage orders: each pass as early as its stage and its inputs allow.

    F(s, b) needs F(s − 1, b); B(s, b) needs F(s, b) and B(s + 1, b) (the last stage only its
    forward). Raises ValueError when an order waits for something that can never come (a
    deadlock, e.g. a backward before its own forward).
    """
    num_stages = len(orders)
    if num_stages < 1:
        raise ValueError("give one order per stage")
    num_micro_batches = len(orders[0]) // 2
    check_orders(orders, num_micro_batches)
    finished: dict[tuple[str, int, int], int] = {}  # (phase, stage, b) -> its slot
    position = [0] * num_stages
    tasks: list[Task] = []
    slot = 0
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        started: list[Task] = []
        for stage in range(num_stages):
            if position[stage] == len(orders[stage]):
                continue
            phase, b = orders[stage][position[stage]]
            if phase == "F":
                needs = [("F", stage - 1, b)] if stage > 0 else []
            else:
                needs = [("F", stage, b)] + ([("B", stage + 1, b)]
                                            if stage < num_stages - 1 else [])
            if all(finished.get(need, slot) < slot for need in needs):
                started.append(Task(slot, stage, int(b), phase))
                position[stage] += 1
        for task in started:
            finished[(task.phase, task.stage, task.micro_batch)] = slot
        tasks += started
        if not started:
            stuck = {s: orders[s][position[s]] for s in range(num_stages)
                     if position[s] < len(orders[s])}
            raise ValueError(f"deadlock in slot {slot}: each stage waits for an input that never "
                             f"comes (next passes: {stuck})")
        slot += 1
    return sorted(tasks, key=lambda task: (task.slot, task.stage))


def gpipe_schedule(num_stages: int, num_micro_batches: int, backward: bool = True) -> list[Task]:
    """The GPipe schedule: all forwards (stage s, micro-batch m in slot s + m), then backwards."""
    tasks = schedule_from_orders(gpipe_orders(num_stages, num_micro_batches))
    return tasks if backward else [task for task in tasks if task.phase == "F"]


def one_f_one_b_schedule(num_stages: int, num_micro_batches: int) -> list[Task]:
    """The 1F1B schedule (one forward, one backward) in time slots."""
    return schedule_from_orders(one_f_one_b_orders(num_stages, num_micro_batches))


def schedule_bubble(tasks: Sequence[Task], num_stages: int) -> float:
    """Idle fraction of a schedule counted in slots: empty (stage, slot) cells over all cells."""
    slots = max(task.slot for task in tasks) + 1
    return 1 - len(tasks) / (num_stages * slots)


def peak_in_flight(tasks: Sequence[Task], num_stages: int) -> list[int]:
    """Per stage, the most micro-batches forwarded and not yet backwarded at any slot."""
    peaks = []
    for stage in range(num_stages):
        alive = peak = 0
        for task in sorted((t for t in tasks if t.stage == stage), key=lambda t: t.slot):
            alive += 1 if task.phase == "F" else -1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks
