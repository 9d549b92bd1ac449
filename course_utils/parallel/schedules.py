"""Pipeline schedules as data: GPipe, 1F1B and interleaved 1F1B, their slots, bubble and memory.

A schedule is first an **order** per stage: the forward ("F") and backward ("B") passes of the
micro-batches in the order that stage runs them. ``schedule_from_orders`` turns orders into time
slots (every pass takes one slot; a pass starts as soon as its stage is free and its inputs are
ready): a forward pass needs the previous stage's forward of the same micro-batch, a backward
pass needs the next stage's backward (the last stage: its own forward). From the slots follow the
**bubble** (idle cells over all cells) and the **activations in flight**: on each stage, the
micro-batches forwarded but not yet backwarded, whose activations the stage must keep.

- GPipe (Huang et al., 2019): every forward, then every backward. Stage 0 keeps all ``M``.
- 1F1B (PipeDream-Flush, Narayanan et al., 2021, arXiv:2006.09503): stage ``s`` runs
  ``K − 1 − s`` warm-up forwards, then alternates one forward and one backward, then drains.
  Same slots, at most ``K − s`` micro-batches in flight on stage ``s``.
- Interleaved 1F1B (Megatron-LM; Narayanan et al., 2021, arXiv:2104.04473): each device holds
  ``v`` chunks of the model (device ``s`` holds virtual stages ``s, s + K, …``); a pass of one
  chunk takes one slot, ``1/v`` of a whole stage's pass.
  Bubble (K − 1) / (v·M + K − 1), counted, not assumed.

Pure Python (no TensorFlow): the lesson, the widget and the exercise checks share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Task", "bubble_fraction", "check_orders", "gpipe_orders", "gpipe_schedule",
           "interleaved_bubble_fraction", "interleaved_orders", "interleaved_schedule",
           "one_f_one_b_orders", "one_f_one_b_schedule",
           "peak_in_flight", "schedule_bubble", "schedule_from_orders"]

Pass = tuple  # ("F", micro_batch) or ("B", micro_batch); with chunks ("F", micro_batch, chunk)


@dataclass(frozen=True)
class Task:
    """A schedule cell: in ``slot``, ``stage`` runs ``phase`` ("F"/"B") of ``micro_batch``.

    ``chunk`` is the model chunk the stage (device) runs, 0 unless the schedule is interleaved.
    """

    slot: int
    stage: int
    micro_batch: int
    phase: str
    chunk: int = 0


#: the most micro-batches a 1F1B order helper was asked for in this process, by helper: lesson
#: 06's check of exercise 1 reads it (orders cut from a longer schedule the helper made before
#: the check are the helper's; nothing else depends on it)
_LARGEST_ASKED: dict[str, int] = {}


def _asked(helper: str, num_micro_batches: int) -> None:
    _LARGEST_ASKED[helper] = max(_LARGEST_ASKED.get(helper, 0), num_micro_batches)


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
    _asked("one_f_one_b_orders", num_micro_batches)
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


def check_orders(orders: Sequence[Sequence[Pass]], num_micro_batches: int,
                 chunks: int = 1) -> None:
    """Raise ValueError unless every stage runs each micro-batch's F and B exactly once.

    With ``chunks`` > 1, entries are ``(phase, micro_batch, chunk)`` and every chunk counts.
    """
    wanted = sorted((phase, b, c) for phase in "FB" for b in range(num_micro_batches)
                    for c in range(chunks))
    shape = "a pair like ('F', 0)" if chunks == 1 else "a triple like ('F', 0, 0)"
    for stage, order in enumerate(orders):
        try:
            got = sorted(_entry(item, chunks) for item in order)
        except (TypeError, ValueError) as error:
            raise ValueError(f"stage {stage}: every entry must be {shape} "
                             f"({error})") from None
        if got != wanted:
            each = "" if chunks == 1 else f" and chunk c in 0..{chunks - 1}"
            raise ValueError(f"stage {stage} must run ('F', b) and ('B', b) once for every "
                             f"micro-batch b in 0..{num_micro_batches - 1}{each}; "
                             f"got {list(order)}")


def _entry(item: Pass, chunks: int) -> tuple[str, int, int]:
    """``(phase, micro_batch, chunk)`` of an order entry; the chunk is 0 in a plain schedule."""
    if chunks == 1:
        phase, b = item
        return str(phase), int(b), 0
    phase, b, chunk = item
    return str(phase), int(b), int(chunk)


def schedule_from_orders(orders: Sequence[Sequence[Pass]], chunks: int = 1) -> list[Task]:
    """Time slots of per-stage orders: each pass as early as its stage and its inputs allow.

    F(s, b) needs F(s − 1, b); B(s, b) needs F(s, b) and B(s + 1, b) (the last stage only its
    forward). With ``chunks`` = v > 1 the pipeline has K·v virtual stages: chunk ``c`` of stage
    ``s`` is virtual stage ``c·K + s``, and the same rule holds between virtual stages. Raises
    ValueError when an order waits for something that can never come (a deadlock, e.g. a
    backward before its own forward).
    """
    num_stages = len(orders)
    if num_stages < 1:
        raise ValueError("give one order per stage")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    num_micro_batches = len(orders[0]) // (2 * chunks)
    check_orders(orders, num_micro_batches, chunks)
    entries = [[_entry(item, chunks) for item in order] for order in orders]
    last = num_stages * chunks - 1  # the last virtual stage
    finished: dict[tuple[str, int, int], int] = {}  # (phase, virtual stage, b) -> its slot
    position = [0] * num_stages
    tasks: list[Task] = []
    slot = 0
    while any(position[s] < len(entries[s]) for s in range(num_stages)):
        started: list[Task] = []
        for stage in range(num_stages):
            if position[stage] == len(entries[stage]):
                continue
            phase, b, chunk = entries[stage][position[stage]]
            virtual = chunk * num_stages + stage
            if phase == "F":
                needs = [("F", virtual - 1, b)] if virtual > 0 else []
            else:
                needs = [("F", virtual, b)] + ([("B", virtual + 1, b)] if virtual < last else [])
            if all(finished.get(need, slot) < slot for need in needs):
                started.append(Task(slot, stage, b, phase, chunk))
                position[stage] += 1
        for task in started:
            finished[(task.phase, task.chunk * num_stages + task.stage, task.micro_batch)] = slot
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


def interleaved_orders(num_stages: int, num_micro_batches: int, chunks: int) -> list[list[Pass]]:
    """Megatron-LM's interleaved 1F1B order: entries ``(phase, micro_batch, chunk)``.

    Forwards go in groups of K micro-batches, chunk 0 first, then chunk 1, …; backwards in the
    same groups, last chunk first. Stage ``s`` warms up with 2·(K − 1 − s) + (v − 1)·K forwards,
    then alternates one forward and one backward, then drains. Needs v ≥ 2 (v = 1 is plain
    1F1B) and M a multiple of K, as Megatron-LM's original version does (later ones relax it).
    """
    _validate(num_stages, num_micro_batches)
    _asked("interleaved_orders", num_micro_batches)
    if chunks < 2:
        raise ValueError(f"interleaving needs chunks >= 2 (1 is one_f_one_b_orders), got {chunks}")
    if num_micro_batches % num_stages:
        raise ValueError(f"num_micro_batches ({num_micro_batches}) must be a multiple of "
                         f"num_stages ({num_stages})")
    group, total = num_stages * chunks, num_micro_batches * chunks

    def nth(k: int, phase: str) -> Pass:
        chunk = (k % group) // num_stages
        b = (k // group) * num_stages + k % num_stages
        return phase, b, chunk if phase == "F" else chunks - 1 - chunk

    orders = []
    for stage in range(num_stages):
        warm_up = min(total, 2 * (num_stages - 1 - stage) + (chunks - 1) * num_stages)
        order = [nth(k, "F") for k in range(warm_up)]
        for k in range(total - warm_up):
            order += [nth(warm_up + k, "F"), nth(k, "B")]
        orders.append(order + [nth(k, "B") for k in range(total - warm_up, total)])
    return orders


def interleaved_schedule(num_stages: int, num_micro_batches: int, chunks: int) -> list[Task]:
    """Interleaved 1F1B in slots of one chunk's pass (1/``chunks`` of a whole stage's pass)."""
    return schedule_from_orders(interleaved_orders(num_stages, num_micro_batches, chunks), chunks)


def schedule_bubble(tasks: Sequence[Task], num_stages: int) -> float:
    """Idle fraction of a schedule counted in slots: empty (stage, slot) cells over all cells."""
    slots = max(task.slot for task in tasks) + 1
    return 1 - len(tasks) / (num_stages * slots)


def peak_in_flight(tasks: Sequence[Task], num_stages: int) -> list[int]:
    """Per stage, the most micro-batches forwarded and not yet backwarded at any slot.

    In an interleaved schedule each count is one chunk's activations (1/v of a stage's).
    """
    peaks = []
    for stage in range(num_stages):
        alive = peak = 0
        for task in sorted((t for t in tasks if t.stage == stage), key=lambda t: t.slot):
            alive += 1 if task.phase == "F" else -1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks
