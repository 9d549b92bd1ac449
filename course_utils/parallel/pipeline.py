"""Pipeline parallelism run for real: K stages on K devices, a schedule's slots, timed events.

``run_pipeline`` runs a schedule (GPipe or 1F1B, from ``course_utils.parallel.schedules``) slot
by slot: each slot's tasks in parallel threads, each stage under its own ``tf.device``; every
task is stamped with its start and end (``Event``), and the activations each stage keeps (its
forward tapes) are counted as they come and go: a micro-batch's backward pass on a stage frees its
tape and its output, which the next stage read as its input (the last stage's outputs stay: they
make up the result; a stage's input is the previous stage's output, or the caller's micro-batch).
``measured_bubble`` reads the idle fraction back from the events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from course_utils.parallel.schedules import (
    Task,
    bubble_fraction,
    gpipe_schedule,
    one_f_one_b_schedule,
    schedule_bubble,
)

__all__ = ["Event", "PipelineRun", "Task", "bubble_fraction", "gpipe_schedule",
           "measured_bubble", "run_gpipe", "run_pipeline", "schedule_bubble"]

SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


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
    peak_in_flight: list[int] = field(default_factory=list)


def measured_bubble(events: Sequence[Event], num_stages: int) -> float:
    """Idle fraction from timestamps: 1 − (time the stages worked) / (K × the run's span)."""
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1 - busy / (num_stages * span)


def run_gpipe(stages: Sequence[Any], devices: Sequence[str], micro_batches: Sequence[Any],
              targets: Sequence[Any] | None = None,
              loss_fn: Callable[[Any, Any], Any] | None = None,
              concurrent: bool = True) -> PipelineRun:
    """``run_pipeline`` with the GPipe schedule (all forwards, then all backwards)."""
    return run_pipeline(stages, devices, micro_batches, targets, loss_fn,
                        schedule="gpipe", concurrent=concurrent)


def run_pipeline(stages: Sequence[Any], devices: Sequence[str], micro_batches: Sequence[Any],
                 targets: Sequence[Any] | None = None,
                 loss_fn: Callable[[Any, Any], Any] | None = None, *,
                 schedule: str = "gpipe", concurrent: bool = True) -> PipelineRun:
    """Run a pipeline ``schedule`` ("gpipe" or "1f1b"): each stage on its device, slot by slot.

    Every task records its start and end (``Event``). With ``targets`` and ``loss_fn`` the
    backward passes run too: each micro-batch's loss is weighted by its share of the examples,
    so the summed loss and gradients equal those of the whole batch at once; each stage keeps a
    micro-batch's tape (its activations) and output from its forward to its backward pass,
    which frees them (the last stage's output stays: it is part of ``outputs``; the stage's
    input is the previous stage's output, freed by that stage's backward pass, or for stage 0
    the caller's micro-batch), and the most tapes it held at once is ``peak_in_flight``.
    Without targets only the forward passes run, and every stage's outputs stay until the run
    ends.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    if len(devices) != len(stages):
        raise ValueError(f"{len(stages)} stages need as many devices, got {len(devices)}")
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
    alive, peaks = [0] * k, [0] * k  # tapes each stage holds now, and at most

    def forward(s: int, b: int) -> None:
        value = tf.convert_to_tensor(micro_batches[b]) if s == 0 else outputs[(s - 1, b)]
        with tf.device(devices[s]), tf.GradientTape(watch_accessed_variables=train) as tape:
            tape.watch(value)
            out = stages[s](value)
            if train and s == k - 1:
                weight = int(micro_batches[b].shape[0]) / total
                losses[b] = loss_fn(targets[b], out) * weight
        inputs[(s, b)], outputs[(s, b)] = value, out
        if train:
            tapes[(s, b)] = tape
            alive[s] += 1
            peaks[s] = max(peaks[s], alive[s])
        devices_used[(s, b, "F")] = out.device

    def backward(s: int, b: int) -> None:
        with tf.device(devices[s]):
            target = losses[b] if s == k - 1 else outputs[(s, b)]
            sources = [inputs[(s, b)], *stages[s].trainable_variables]
            result = tapes.pop((s, b)).gradient(target, sources,
                                                output_gradients=upstream.pop((s, b), None))
            grads[s] = [acc + g for acc, g in zip(grads[s], result[1:], strict=False)]
        if s > 0:
            upstream[(s - 1, b)] = result[0]
        if s < k - 1:  # its output was the next stage's input and this pass's target
            del outputs[(s, b)]
        devices_used[(s, b, "B")] = result[1].device
        alive[s] -= 1  # the tape and the activations it kept are gone
        del inputs[(s, b)]

    def timed(task: Task) -> Event:
        start = time.perf_counter()
        (forward if task.phase == "F" else backward)(task.stage, task.micro_batch)
        return Event(task.stage, task.micro_batch, task.phase, start, time.perf_counter())

    tasks = SCHEDULES[schedule](k, m)
    slots: dict[int, list[Task]] = {}
    for task in (t for t in tasks if train or t.phase == "F"):
        slots.setdefault(task.slot, []).append(task)
    with ThreadPoolExecutor(max_workers=k if concurrent else 1) as pool:
        for slot in sorted(slots):
            events += list(pool.map(timed, slots[slot]))
    result = tf.concat([outputs[(k - 1, b)] for b in range(m)], axis=0)
    loss = tf.add_n(losses) if train else None
    return PipelineRun(result, events, loss, [g for stage in grads for g in stage], devices_used,
                       peaks)
