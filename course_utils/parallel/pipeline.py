"""Pipeline parallelism (GPipe): the schedule of K stages × M micro-batches, a run, the bubble.

GPipe runs every micro-batch forward through the stages, then every micro-batch backward: in
time slot ``t`` stage ``s`` works on forward micro-batch ``t - s``. Each stage waits ``K - 1``
slots to start and sits idle ``K - 1`` slots at the end, so a fraction (K−1)/(M+K−1) of its
time is idle: the bubble.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "PipelineRun", "Task", "bubble_fraction", "gpipe_schedule",
           "measured_bubble", "run_gpipe", "schedule_bubble"]


@dataclass(frozen=True)
class Task:
    """A schedule cell: in ``slot``, ``stage`` runs ``phase`` ("F"/"B") of ``micro_batch``."""

    slot: int
    stage: int
    micro_batch: int
    phase: str


@dataclass(frozen=True)
class Event:
    """A task as it ran: its stage, micro-batch and phase, with start and end times in seconds."""

    stage: int
    micro_batch: int
    phase: str
    start: float
    end: float


@dataclass
class PipelineRun:
    """What ``run_gpipe`` returns: outputs, loss and gradients (when asked), the timed events."""

    outputs: Any
    events: list[Event]
    loss: Any = None
    grads: list[Any] = field(default_factory=list)
    devices: dict[tuple[int, int, str], str] = field(default_factory=dict)


def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    """GPipe's idle fraction of each stage: (K − 1) / (M + K − 1)."""
    if num_stages < 1 or num_micro_batches < 1:
        raise ValueError("num_stages and num_micro_batches must be at least 1")
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def gpipe_schedule(num_stages: int, num_micro_batches: int, backward: bool = True) -> list[Task]:
    """The GPipe schedule: all forwards (stage s, micro-batch m in slot s + m), then backwards."""
    k, m = num_stages, num_micro_batches
    bubble_fraction(k, m)  # validates
    tasks = [Task(s + b, s, b, "F") for s in range(k) for b in range(m)]
    if backward:
        first = m + k - 1
        tasks += [Task(first + (k - 1 - s) + b, s, b, "B") for s in range(k) for b in range(m)]
    return sorted(tasks, key=lambda task: (task.slot, task.stage))


def schedule_bubble(tasks: Sequence[Task], num_stages: int) -> float:
    """Idle fraction of a schedule counted in slots: empty (stage, slot) cells over all cells."""
    slots = max(task.slot for task in tasks) + 1
    return 1 - len(tasks) / (num_stages * slots)


def measured_bubble(events: Sequence[Event], num_stages: int) -> float:
    """Idle fraction from timestamps: 1 − (time the stages worked) / (K × the run's span)."""
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1 - busy / (num_stages * span)


def run_gpipe(stages: Sequence[Any], devices: Sequence[str], micro_batches: Sequence[Any],
              targets: Sequence[Any] | None = None,
              loss_fn: Callable[[Any, Any], Any] | None = None,
              concurrent: bool = True) -> PipelineRun:
    """Run the GPipe schedule: each stage on its device, each slot's tasks in parallel threads.

    Every task records its start and end (``Event``). With ``targets`` and ``loss_fn`` the
    backward half runs too: each micro-batch's loss is weighted by its share of the examples,
    so the summed loss and gradients equal those of the whole batch at once.
    """
    import tensorflow as tf

    k, m = len(stages), len(micro_batches)
    train = targets is not None and loss_fn is not None
    total = sum(int(b.shape[0]) for b in micro_batches)
    inputs: dict[tuple[int, int], Any] = {}
    outputs: dict[tuple[int, int], Any] = {}
    tapes: dict[tuple[int, int], Any] = {}
    upstream: dict[tuple[int, int], Any] = {}
    losses: list[Any] = [None] * m
    grads: list[list[Any]] = [[tf.zeros_like(v) for v in s.trainable_variables] for s in stages]
    devices_used: dict[tuple[int, int, str], str] = {}
    events: list[Event] = []

    def forward(s: int, b: int) -> None:
        value = tf.convert_to_tensor(micro_batches[b]) if s == 0 else outputs[(s - 1, b)]
        with tf.device(devices[s]), tf.GradientTape(watch_accessed_variables=train) as tape:
            tape.watch(value)
            out = stages[s](value)
            if train and s == k - 1:
                weight = int(micro_batches[b].shape[0]) / total
                losses[b] = loss_fn(targets[b], out) * weight
        inputs[(s, b)], outputs[(s, b)], tapes[(s, b)] = value, out, tape
        devices_used[(s, b, "F")] = out.device

    def backward(s: int, b: int) -> None:
        with tf.device(devices[s]):
            target = losses[b] if s == k - 1 else outputs[(s, b)]
            sources = [inputs[(s, b)], *stages[s].trainable_variables]
            result = tapes[(s, b)].gradient(target, sources,
                                            output_gradients=upstream.get((s, b)))
            grads[s] = [acc + g for acc, g in zip(grads[s], result[1:], strict=False)]
        if s > 0:
            upstream[(s - 1, b)] = result[0]
        devices_used[(s, b, "B")] = result[1].device

    def timed(task: Task) -> Event:
        start = time.perf_counter()
        (forward if task.phase == "F" else backward)(task.stage, task.micro_batch)
        return Event(task.stage, task.micro_batch, task.phase, start, time.perf_counter())

    schedule = gpipe_schedule(k, m, backward=train)
    slots: dict[int, list[Task]] = {}
    for task in schedule:
        slots.setdefault(task.slot, []).append(task)
    with ThreadPoolExecutor(max_workers=k if concurrent else 1) as pool:
        for slot in sorted(slots):
            events += list(pool.map(timed, slots[slot]))
    result = tf.concat([outputs[(k - 1, b)] for b in range(m)], axis=0)
    loss = tf.add_n(losses) if train else None
    return PipelineRun(result, events, loss, [g for stage in grads for g in stage], devices_used)
