"""Profiler traces built to order, for lesson 09's bottleneck check.

A real profile on a busy laptop lands where the machine puts it: an input-bound run and a
compute-bound run are easy to make, a step that waits 40 % of its time for input or one that is
communication-bound on two logical CPUs is not. ``synthetic_trace`` writes the Chrome-trace
events of such steps in the shape ``cu.profiling.trace_events`` returns for real ones (step
markers with ``step_num``, ``IteratorGetNext`` waits with their ``Iterator::`` stages (each with
the ``long_name`` a real trace gives it, ``Iterator::Root::Prefetch``), ops with
``long_name``, ``CollectiveReduceV2`` and ``NcclAllReduce`` ops, ``tf_data`` threads, ``M``
events naming the threads), so that a reading which works on real traces works on these, and
shortcuts do not:

* ``background``: spans of the input pipeline's own threads inside the steps (not step time);
* ``outside``: compute spans outside every step (the warm-up's), as a share of the steps' time;
* ``trailing``: compute spans after the last step (what the program does once the profiled steps
  are done), as a share of the steps' time: a reading that drops only what precedes the first
  step counts them;
* ``between``: compute spans filling a gap after every step but the last (what a callback or a
  checkpoint does between steps), as a share of that step's time: a reading that takes one
  window from the first step's start to the last step's end counts them;
* ``wrappers``: the executor's own spans, which have no ``long_name`` (``EagerKernelExecute``
  on the step's thread around every input wait, as a real eager get-next has): a reading that
  counts every span but the input's as compute names compute where input leads (x09 L6: only a
  real input-bound run, drawn half the time, failed it);
* ``inline``: the second half of every compute span run on the step's own thread (a function
  run inline by its caller), so that a reading that counts ops on ``tf_Compute`` threads only
  loses half of the compute (x09 L7);
* ``uneven``: one long step in the middle split otherwise than the rest;
* ``overlap``: compute on a second thread through part of every input wait, so that the
  exercise's rule (each part's union on its own: an instant two parts share counts in both,
  ``part_unions``) names compute where ``cu.profiling.step_breakdown`` (which gives such an
  instant to input) names input, and an edited copy of the course's reading fails.

Four cases lead by a little, each leader under half of the three parts together: input at under a
third of the step where compute leads another with input at nearly 40 %, and the all-reduce at
about a third where compute leads another with the all-reduce at 40 %, so that no threshold on
one share (input's or communication's, of the step or of the three parts), and no "the part over
half of them, else ..." rule, names them all. Between them the cases hold all six orders of the
three parts, so that a reading which compares fewer than the three pairs (input with compute
first, say, or the all-reduce with compute alone) names a wrong part in one.

Within a step the spans of different parts do not overlap but where ``overlap`` puts them, so
the shares are exact: ``cu.profiling.step_breakdown`` reads back ``parts`` without ``overlap``
(tests/test_checks_lesson_09.py proves it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

__all__ = ["BOTTLENECK_CASES", "part_unions", "rule_verdict", "synthetic_trace", "trace_case"]

_PID = 1
_STEP_THREAD, _OP_THREAD, _DATA_THREAD, _REPLICA_THREAD = 11, 12, 13, 14
_THREADS = {_STEP_THREAD: "python3", _OP_THREAD: "tf_Compute/4711",
            _DATA_THREAD: "tf_data_private_threadpool/815", _REPLICA_THREAD: "tf_Compute/4712"}
_OPS = ("conv/Conv2D:Conv2D", "dense/MatMul:MatMul", "dense/BiasAdd:BiasAdd", "relu/Relu:Relu",
        "Adam/AssignSubVariableOp:AssignSubVariableOp", "grad/Conv2DBackpropFilter:"
        "Conv2DBackpropFilter")
_COLLECTIVES = ("CollectiveReduceV2:CollectiveReduceV2", "allreduce/CollectiveReduceV2_1:"
                "CollectiveReduceV2")
# tf.distribute.NcclAllReduce's op, under a node name that does not say so: a reading that
# tells collectives by the span's name, not the op type after ":", loses it (x09 L5)
_NCCL = "replica_sum/all_reduce_1:NcclAllReduce"
_DATA_OPS = ("map/Cast:Cast", "ParallelMapV2/py_function:EagerPyFunc")


def _pieces(rng: random.Random, total: float, count: int) -> list[float]:
    cuts = sorted(rng.uniform(0, total) for _ in range(count - 1))
    return [b - a for a, b in zip([0.0, *cuts], [*cuts, total], strict=True)]


def _span(name: str, ts: float, dur: float, tid: int, long_name: str | None = None,
          **args: Any) -> dict[str, Any]:
    if long_name is not None:
        args["long_name"] = long_name
    return {"ph": "X", "name": name, "ts": round(ts, 3), "dur": round(dur, 3), "pid": _PID,
            "tid": tid, "args": args}


def synthetic_trace(rng: random.Random, parts: Mapping[str, float], *, steps: int = 3,
                    background: float = 0.0, outside: float = 0.0, trailing: float = 0.0,
                    between: float = 0.0,
                    uneven: Mapping[str, float] | None = None,
                    nccl: bool = False, replicas: int = 1, overlap: float = 0.0,
                    wrappers: bool = False, inline: bool = False, spill: float = 0.0,
                    waits_outside: float = 0.0, twins: bool = False) -> list[dict[str, Any]]:
    """Events of ``steps`` profiled steps whose time splits into ``parts`` (shares of input,
    compute, communication; the rest is "other"), plus the distractors described above.

    ``uneven``: one step, neither the first nor the last, as long as all the others together
    and split into these shares instead, so that the steps' total and a single step (or a vote
    of the steps) can name different parts. ``nccl``: the second half of every all-reduce span
    an ``NcclAllReduce`` op, so that a reading which misses either kind of collective loses
    half of the communication. ``overlap``: a compute span on the second replica's thread
    through that share of every input wait. ``spill``: a compute op that starts at the end
    of every step and runs that share of it past its end; ``waits_outside``: get-next waits
    before the first step (the warm-up's), as a share of the steps' time; ``twins``: the
    get-next op around every wait, and each all-reduce on the other replica's thread too
    (xf09: spans not clipped to the steps, get-next counted outside them, and input or the
    all-reduce summed without a union each passed every case)."""
    for shares in (parts, uneven or {}):
        if sum(shares.values()) > 1 or min(shares.values(), default=0) < 0:
            raise ValueError(f"parts must be non-negative shares summing to at most 1: "
                             f"{shares}")
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": _PID,
                                     "args": {"name": "/host:CPU"}}]
    events += [{"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid, "args": {"name": name}}
               for tid, name in _THREADS.items()]
    clock = 1_000.0
    step_lengths = [rng.uniform(20_000, 60_000) for _ in range(steps)]
    step_parts = [parts] * steps
    if uneven:
        if steps < 3:
            raise ValueError("an uneven trace needs 3 steps or more")
        big = rng.randint(1, steps - 2)
        step_lengths[big] = sum(step_lengths) - step_lengths[big]
        step_parts[big] = uneven
    if outside:  # the warm-up: compute before the first profiled step
        for piece in _pieces(rng, outside * sum(step_lengths), 6):
            events.append(_span(rng.choice(_OPS).split(":")[0], clock, piece, _OP_THREAD,
                                rng.choice(_OPS)))
            clock += piece
        clock += 500.0
    if waits_outside:  # the warm-up waits for its first batches: no step's time
        for piece in _pieces(rng, waits_outside * sum(step_lengths), 3):
            events.append(_span("IteratorGetNextOp::DoCompute", clock, piece, _STEP_THREAD))
            clock += piece + 100.0
        clock += 500.0
    for number, (length, shares) in enumerate(zip(step_lengths, step_parts, strict=True)):
        start = clock
        events.append(_span(f"train {number}", start, length, _STEP_THREAD, step_num=number, _r=1))
        blocks = [(kind, share * length) for kind, share in shares.items() if share > 0]
        gap = (1 - sum(shares.values())) * length
        rng.shuffle(blocks)
        gaps = _pieces(rng, gap, len(blocks) + 1)
        clock = start + gaps[0]
        for (kind, block), after in zip(blocks, gaps[1:], strict=True):
            for piece in _pieces(rng, block, 3):
                if kind == "input":
                    events.append(_span("IteratorGetNextOp::DoCompute", clock, piece,
                                        _STEP_THREAD))
                    if twins:  # the op around it, as real traces have it: the same instants
                        events.append(_span("IteratorGetNext", clock, piece, _STEP_THREAD,
                                            "IteratorGetNext:IteratorGetNext"))
                    # a stage the get-next ran, named as in real traces (with a long_name):
                    # a reading that counts it as compute names compute where input leads
                    events.append(_span("Iterator::Prefetch", clock + 0.1 * piece,
                                        0.8 * piece, _STEP_THREAD, "Iterator::Root::Prefetch"))
                    if wrappers:  # the executor's span around it: not an op's
                        events.append(_span("EagerKernelExecute", clock - 0.01 * piece,
                                            1.02 * piece, _STEP_THREAD))
                    if overlap:  # the other replica computes while this one waits
                        name = rng.choice(_OPS)
                        events.append(_span(name.split(":")[0], clock, overlap * piece,
                                            _REPLICA_THREAD, name))
                elif kind == "communication":
                    halves = ((clock, piece / 2, rng.choice(_COLLECTIVES)),
                              (clock + piece / 2, piece / 2, _NCCL)) if nccl else (
                        (clock, piece, rng.choice(_COLLECTIVES)),)
                    for start_at, dur, name in halves:  # the other replica's inside it
                        events += [_span(name.split(":")[0], start_at + at * dur, (1 - 2 * at)
                                         * dur, tid, name)
                                   for at, tid in ((0, _OP_THREAD), (0.02, _REPLICA_THREAD))
                                   [:1 + twins]]
                else:
                    long_name = rng.choice(_OPS)
                    halves = kind == "compute" and inline  # the second half on the caller's
                    events += [_span(long_name.split(":")[0], clock + at * piece / 2,
                                     piece / 2 if halves else piece, tid, long_name)
                               for at, tid in ((0, _OP_THREAD), (1, _STEP_THREAD))[:1 + halves]]
                    if kind == "compute" and replicas > 1:  # the other replica, side by side
                        shift = rng.uniform(0.05, 0.3) * piece  # overlapping, not identical
                        events.append(_span(long_name.split(":")[0], clock + shift,
                                            piece - shift * rng.uniform(1.0, 1.5),
                                            _REPLICA_THREAD, long_name))
                clock += piece
            clock += after
        if background:  # the pipeline works ahead on its own thread: no step time
            moment = start
            for piece in _pieces(rng, background * length, 4):
                events.append(_span(rng.choice(_DATA_OPS).split(":")[0], moment, piece,
                                    _DATA_THREAD, rng.choice(_DATA_OPS)))
                moment += piece
        if spill:  # an op begun at the step's end runs on past it: only its start counts
            name = rng.choice(_OPS)
            events.append(_span(name.split(":")[0], start + 0.998 * length,
                                (0.002 + spill) * length, _OP_THREAD, name))
        clock = start + (1 + spill) * length + rng.uniform(200, 800)
        if between and number < steps - 1:  # work between this step and the next
            for piece in _pieces(rng, between * length, 4):
                events.append(_span(rng.choice(_OPS).split(":")[0], clock, piece, _OP_THREAD,
                                    rng.choice(_OPS)))
                clock += piece
            clock += rng.uniform(200, 800)
    for piece in _pieces(rng, trailing * sum(step_lengths), 6) if trailing else []:
        events.append(_span(rng.choice(_OPS).split(":")[0], clock, piece, _OP_THREAD,
                            rng.choice(_OPS)))  # after the last step: no step's time
        clock += piece
    return events


#: The check's built cases: (what they test, the answer, how to draw the parts, options).
BOTTLENECK_CASES = {
    "input is the largest part but under half the step, the pipeline busy in the background": (
        "input", lambda r: (r.uniform(0.38, 0.45), 0.25, r.uniform(0.04, 0.08)), {
            "background": 0.35, "wrappers": True, "spill": 0.3}),
    "compute is the largest part, input waits a third of the step": (
        "compute", lambda r: (r.uniform(0.3, 0.36), r.uniform(0.46, 0.52), 0.05), {
            "inline": True, "waits_outside": 0.5}),
    "input leads by a little, under half of the three parts (the all-reduce, then compute, "
    "close behind)": (
        "input", lambda r: (r.uniform(0.30, 0.31), r.uniform(0.24, 0.25), r.uniform(0.26, 0.27)),
        {}),
    "compute leads by a little, input close behind at nearly 40 % of the step": (
        "compute", lambda r: (r.uniform(0.39, 0.40), r.uniform(0.42, 0.43),
                              r.uniform(0.05, 0.06)), {"twins": True}),
    # compute above half of the all-reduce: a reading that drops either kind of collective fails
    "communication-bound: the all-reduce (collective and NCCL ops) takes most of the step": (
        "communication", lambda r: (r.uniform(0.08, 0.12), 0.3, r.uniform(0.45, 0.55)), {
            "nccl": True}),
    "the all-reduce leads by a little, at about a third of the step, input close behind": (
        "communication", lambda r: (r.uniform(0.31, 0.32), r.uniform(0.20, 0.21),
                                    r.uniform(0.34, 0.35)), {}),
    "compute leads by a little, the all-reduce close behind at 40 % of the step": (
        "compute", lambda r: (r.uniform(0.05, 0.06), r.uniform(0.45, 0.46),
                              r.uniform(0.40, 0.41)), {"nccl": True, "twins": True}),
    # nb31-09 L1-c: one window from the first step's start to the last one's end passed
    "input-bound steps after a long warm-up of compute outside them, and compute between them": (
        "input", lambda r: (r.uniform(0.5, 0.6), 0.2, 0.03), {"outside": 3.0, "between": 1.0}),
    "input-bound steps, then a long stretch of compute after the last of them": (
        "input", lambda r: (r.uniform(0.5, 0.6), 0.2, 0.03), {"trailing": 3.0}),
    # as under MirroredStrategy: each replica's ops on a thread of its own, at the same time;
    # summed span by span, compute counts each instant twice and outranks the input wait
    "input leads, while two replicas compute side by side on two threads": (
        "input", lambda r: (r.uniform(0.40, 0.44), r.uniform(0.30, 0.34), 0.03), {
            "replicas": 2}),
    # each part's union on its own (the exercise's rule): the instants compute shares with the
    # input wait count for compute too; cu.profiling.step_breakdown gives them to input alone
    "compute on a second thread through most of every input wait, each part counted on its own":
        ("compute", lambda r: (r.uniform(0.30, 0.32), r.uniform(0.18, 0.20), 0.05), {
            "overlap": 0.8}),
    "input-bound in total, though most steps (the first and the last too) are compute-bound": (
        "input", lambda r: (0.1, r.uniform(0.55, 0.65), 0.05), {
            "uneven": {"input": 0.8, "compute": 0.1, "communication": 0.02}}),
}


def trace_case(rng: random.Random, description: str) -> tuple[str, list[dict[str, Any]]]:
    """The answer and the events of one of ``BOTTLENECK_CASES``, drawn afresh."""
    answer, draw, options = BOTTLENECK_CASES[description]
    shares = dict(zip(("input", "compute", "communication"), draw(rng), strict=True))
    return answer, synthetic_trace(rng, shares, steps=rng.choice([3, 4, 5]), **options)


def part_unions(events: list[dict[str, Any]]) -> dict[str, float]:
    """Microseconds of the profiled steps each part covers, its spans' union taken on its own
    (an instant two parts share counts in both: the exercise's rule), from the spans and
    steps ``cu.profiling`` finds."""
    from course_utils import profiling

    found = profiling.spans(events)
    totals = dict.fromkeys(profiling.CATEGORIES, 0.0)
    for window in profiling.step_windows(events):
        for part in totals:
            mine = [(span.start, span.end, part) for span in found if span.category == part]
            totals[part] += profiling._attribute(window, mine)[part]  # one part: its union
    return totals


def rule_verdict(events: list[dict[str, Any]]) -> tuple[str, str]:
    """The part that leads by the exercise's rule (``part_unions``), and a table of each
    part's milliseconds and share of the steps' time."""
    from course_utils import profiling

    totals = part_unions(events)
    steps = sum(end - start for start, end in profiling.step_windows(events)) or 1.0
    table = "\n".join(f"{part:<14}{micros / 1e3:>9.2f} ms{micros / steps:>6.0%} of the steps"
                      for part, micros in totals.items())
    return max(totals, key=totals.get), table
