"""Where a training step's time goes: a TensorFlow profiler trace, read back and split (09).

Three steps, the same three a practitioner takes in TensorBoard's Profile tab::

    xplane = cu.profiling.capture(run_step, steps=5, logdir="logs/profile")
    events = cu.profiling.trace_events(xplane)           # the trace viewer's events
    breakdown = cu.profiling.step_breakdown(events)      # input / compute / communication
    print(cu.profiling.format_breakdown(breakdown))      # ... and breakdown.bottleneck()

``capture`` runs ``run_step(step)`` under ``tf.profiler.experimental.start``/``stop``, each step
inside ``tf.profiler.experimental.Trace("train", step_num=step, _r=1)``: the step markers
TensorBoard's profiler uses. The ``.xplane.pb`` it writes is what ``tensorboard --logdir LOGDIR``
shows (with ``tensorboard-plugin-profile`` installed). ``trace_events`` converts it with the
plugin's own converter (``xprof.convert.raw_to_tool_data``, tool ``trace_viewer``) into Chrome
trace events: dicts with ``name``, ``ph`` (``"X"`` for a span), ``ts`` and ``dur`` in
microseconds, ``pid``/``tid`` and ``args``, plus ``"M"`` events that name the threads.

How ``step_breakdown`` attributes a step's wall time (read from real TensorFlow 2.21 traces:
a ``tf.function`` step fed by a tf.data iterator, alone and under ``MirroredStrategy``):

- **step**: the span of each step marker (an event with ``step_num`` in its args, named
  ``"train 3"``); ``step_s`` is the median over the steps.
- **input**: the time the step waited for its next element: the spans of the iterator's
  get-next kernels (``IteratorGetNextOp::DoCompute`` and the other ``IteratorGetNext*``,
  ``*GetNextFromShard*`` events, and the ``Iterator::*`` pipeline stages they run on the step's
  own thread) that fall inside the step. What the input pipeline did in the
  background while the step computed (its threads are named ``tf_data_*``) is not counted:
  a prefetched element costs the step nothing.
- **communication**: the spans of collective ops (``CollectiveReduceV2``, ``NcclAllReduce``,
  ``CollectiveGather``, ``AllReduce``, ``AllToAll`` ... on any device) inside the step, where
  no op computes at the same time.
- **compute**: the spans of every other TensorFlow op (an event whose args hold ``long_name``,
  ``"layer/MatMul:MatMul"``) and every device kernel, outside the tf.data threads.
- **other**: the rest of the step: Python, dispatching the function, gaps between ops.

Where spans overlap, an instant counts once, as the first of input, compute, communication that
is running then: a step that waits for its element waits, whatever else runs; a collective that
runs while another replica still computes is hidden behind that compute (it is mostly waiting
for it), so only communication that nothing overlaps is "communication". Seconds per step are
the shares of the summed step time (all steps together) times the median step, so they add up to
``step_s`` exactly.

What it cannot see: a collective whose replicas all wait for something else (a straggler process
on another machine, a slow host) is "communication" though nothing was sent; an element the
pipeline produced in the background but too late still shows as input wait, which is the point,
but *why* it was late (a slow map, I/O, too little parallelism) is in the ``tf_data_*`` threads,
which this summary
leaves out; on a GPU, kernels that overlap the host's input wait are not compute in this split.
Python work inside a step (outside any op) is "other".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "OVERVIEW_FIELDS",
    "Span",
    "StepBreakdown",
    "breakdown_rows",
    "capture",
    "format_breakdown",
    "overview_verdict",
    "spans",
    "step_breakdown",
    "step_windows",
    "trace_events",
]

#: The parts of a step, in the order in which overlapping spans are attributed.
CATEGORIES = ("input", "compute", "communication")

_INPUT_EVENT = re.compile(r"^(IteratorGetNext|MultiDeviceIteratorGetNext)|GetNextFromShard")
_COLLECTIVE = re.compile(r"collective|nccl|allreduce|all_reduce|allgather|all_gather|alltoall|"
                         r"all_to_all|reducescatter|reduce_scatter", re.IGNORECASE)
_INPUT_THREAD_PREFIX = "tf_data"


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Seconds per training step spent on input, compute, communication and the rest."""

    steps: int
    step_s: float
    input_s: float
    compute_s: float
    communication_s: float
    other_s: float

    def shares(self) -> dict[str, float]:
        """Each part's share of the step time (input, compute, communication, other; sums to 1)."""
        parts = {"input": self.input_s, "compute": self.compute_s,
                 "communication": self.communication_s, "other": self.other_s}
        total = sum(parts.values())
        if total <= 0:
            return {name: 0.0 for name in parts}
        return {name: value / total for name, value in parts.items()}

    def bottleneck(self) -> str:
        """The part to remove first: "input", "compute" or "communication", whichever is largest."""
        shares = self.shares()
        return max(("input", "compute", "communication"), key=lambda name: shares[name])


# ----------------------------------------------------------------------------- capture


def _xplanes(logdir: Path) -> set[Path]:
    return set(logdir.glob("plugins/profile/*/*.xplane.pb"))


def capture(run_steps: Callable[[int], Any], steps: int, logdir: str | os.PathLike[str], *,
            warmup: int = 1) -> Path:
    """Profile ``steps`` calls of ``run_steps(step)`` after ``warmup`` unprofiled; the .xplane.pb.

    Warm-up steps are numbered ``0 .. warmup-1``, profiled ones ``warmup .. warmup+steps-1``;
    each profiled step is the span ``"train N"`` of the trace. The profiler is stopped even when
    a step raises. View the result with ``tensorboard --logdir LOGDIR`` (Profile tab).
    """
    from course_utils.quiet import import_tensorflow

    tf = import_tensorflow()
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    logdir = Path(logdir)
    for step in range(warmup):  # tracing and the first pipeline fill stay out of the profile
        run_steps(step)
    before = _xplanes(logdir)
    tf.profiler.experimental.start(str(logdir))
    try:
        for step in range(warmup, warmup + steps):
            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                run_steps(step)
    finally:
        tf.profiler.experimental.stop()
    written = sorted(_xplanes(logdir) - before, key=lambda path: path.stat().st_mtime)
    if not written:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}/plugins/profile")
    return written[-1]


# ----------------------------------------------------------------------------- reading


def _find_xplane(xplane: str | os.PathLike[str]) -> Path:
    path = Path(xplane)
    if path.is_dir():
        found = sorted(path.glob("**/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise FileNotFoundError(
                f"no .xplane.pb under {path}: profile a few steps first "
                "(cu.profiling.capture, or tf.profiler.experimental.start/stop)")
        return found[-1]
    if not path.is_file():
        raise FileNotFoundError(
            f"no profiler trace at {path}: pass the .xplane.pb that cu.profiling.capture "
            "returned (or the log directory that holds it)")
    if not path.name.endswith(".xplane.pb"):
        raise ValueError(f"{path} is not a profiler trace (expected a file ending in .xplane.pb)")
    return path


def trace_events(xplane: str | os.PathLike[str]) -> list[dict]:
    """The Chrome-trace events of a profile (a .xplane.pb, or the newest one under a directory)."""
    from course_utils.quiet import quiet_tensorflow

    quiet_tensorflow()
    from xprof.convert import raw_to_tool_data

    path = _find_xplane(xplane)
    data = raw_to_tool_data.xspace_to_tool_data([str(path)], "trace_viewer", {})
    if isinstance(data, tuple):  # (content, content type)
        data = data[0]
    if isinstance(data, bytes):
        data = data.decode()
    if not data:
        raise ValueError(f"xprof could not convert {path} to trace events")
    return list(json.loads(data).get("traceEvents", []))


# ----------------------------------------------------------------------------- the Overview page


#: The Overview page's fields ``overview_verdict`` returns (xprof's ``overview_page`` tool).
OVERVIEW_FIELDS = ("hardware_type", "steptime_ms_average", "input_conclusion",
                   "summary_nextstep")


def overview_verdict(xplane: str | os.PathLike[str]) -> dict[str, str]:
    """The Profile tab's Overview page verdict on a trace: hardware type, average step time,
    its input-bound conclusion and next step, read with the installed plugin's converter
    (``xprof``, from ``tensorboard-plugin-profile``). On a CPU-only trace the page finds no
    device steps and says so in ``input_conclusion``."""
    from course_utils.quiet import quiet_tensorflow

    quiet_tensorflow()
    from xprof.convert import raw_to_tool_data

    data = raw_to_tool_data.xspace_to_tool_data([str(_find_xplane(xplane))], "overview_page", {})
    if isinstance(data, tuple):
        data = data[0]
    tables = json.loads(data.decode() if isinstance(data, bytes) else data)
    properties: dict[str, Any] = {}
    for table in tables if isinstance(tables, list) else [tables]:
        properties.update(table.get("p", {}))
    return {field: str(properties.get(field, "")) for field in OVERVIEW_FIELDS}


# ----------------------------------------------------------------------------- attribution


def _thread_names(events: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, Any], str]:
    names = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[(event.get("pid"), event.get("tid"))] = str(event.get("args", {}).get("name", ""))
    return names


def _process_names(events: Sequence[Mapping[str, Any]]) -> dict[Any, str]:
    return {event.get("pid"): str(event.get("args", {}).get("name", ""))
            for event in events if event.get("ph") == "M" and event.get("name") == "process_name"}


def _category(event: Mapping[str, Any], thread: str, process: str) -> str | None:
    """input / communication / compute for one span, or None when it is not an op's span."""
    name = str(event.get("name", ""))
    args = event.get("args") or {}
    if _INPUT_EVENT.search(name):
        return "input"
    if thread.startswith(_INPUT_THREAD_PREFIX):
        return None  # the pipeline's own work in the background
    if name.startswith("Iterator::"):
        return "input"  # a pipeline stage run by the step's own thread: it waits for it
    is_op = "long_name" in args and ":" in str(args["long_name"])
    on_device = process.startswith("/device:") and not process.startswith("/device:CPU")
    if not (is_op or on_device):
        return None  # a wrapper (executor, thread pool, Python call)
    op_type = str(args.get("long_name", name)).rsplit(":", 1)[-1] if is_op else name
    if _COLLECTIVE.search(op_type):
        return "communication"
    return "compute"


def _attribute(window: tuple[float, float],
               spans: Iterable[tuple[float, float, str]]) -> dict[str, float]:
    """Microseconds of ``window`` covered by each category, an instant counting once."""
    start, end = window
    points: list[tuple[float, int, str]] = []
    for begin, finish, category in spans:
        begin, finish = max(begin, start), min(finish, end)
        if finish > begin:
            points += [(begin, 1, category), (finish, -1, category)]
    points.sort(key=lambda point: (point[0], point[1]))
    covered = dict.fromkeys(CATEGORIES, 0.0)
    active = dict.fromkeys(CATEGORIES, 0)
    last = start
    for t, change, category in points:
        top = next((c for c in CATEGORIES if active[c] > 0), None)
        if top is not None:
            covered[top] += t - last
        active[category] += change
        last = t
    return covered


@dataclasses.dataclass(frozen=True)
class Span:
    """One op's span in a trace: its thread, start and end (µs), category and name."""

    thread: str
    start: float
    end: float
    category: str
    name: str


def spans(events: Sequence[Mapping[str, Any]]) -> list[Span]:
    """Every span ``step_breakdown`` counts (input, compute, communication), by start time."""
    threads, processes = _thread_names(events), _process_names(events)
    found = []
    for event in events:
        if event.get("ph") != "X" or "dur" not in event or "ts" not in event:
            continue
        thread = threads.get((event.get("pid"), event.get("tid")), "")
        category = _category(event, thread, processes.get(event.get("pid"), ""))
        if category is not None:
            start = float(event["ts"])
            found.append(Span(thread or str(event.get("tid")), start,
                              start + float(event["dur"]), category, str(event.get("name"))))
    return sorted(found, key=lambda span: span.start)


def step_windows(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) in µs of each profiled step: the spans with ``step_num`` in their args."""
    steps: dict[Any, tuple[float, float]] = {}
    for event in events:
        args = event.get("args") or {}
        if (event.get("ph") == "X" and "step_num" in args and "ts" in event
                and args["step_num"] not in steps):
            start = float(event["ts"])
            steps[args["step_num"]] = (start, start + float(event.get("dur", 0)))
    return sorted(steps.values())


def _events_of(source: Any) -> list[dict]:
    if isinstance(source, Mapping):
        return list(source.get("traceEvents", []))
    if isinstance(source, (str, os.PathLike)):
        return trace_events(source)
    return list(source)


def step_breakdown(xplane_or_events: Any) -> StepBreakdown:
    """Split each profiled step's wall time into input, compute, communication and other."""
    events = _events_of(xplane_or_events)
    windows = step_windows(events)
    if not windows:
        raise ValueError(
            "no training steps in this trace: wrap each step in "
            "tf.profiler.experimental.Trace('train', step_num=step, _r=1) "
            "(cu.profiling.capture does)")
    categorized = [(span.start, span.end, span.category) for span in spans(events)]
    totals = dict.fromkeys(CATEGORIES, 0.0)
    step_total = 0.0
    durations = []
    for start, end in windows:
        inside = [span for span in categorized if span[0] < end and span[1] > start]
        for category, micros in _attribute((start, end), inside).items():
            totals[category] += micros
        step_total += end - start
        durations.append((end - start) / 1e6)
    step_s = statistics.median(durations)
    share = {c: (totals[c] / step_total if step_total > 0 else 0.0) for c in CATEGORIES}
    input_s, compute_s, communication_s = (share[c] * step_s for c in CATEGORIES)
    return StepBreakdown(steps=len(windows), step_s=step_s, input_s=input_s, compute_s=compute_s,
                         communication_s=communication_s,
                         other_s=max(0.0, step_s - input_s - communication_s - compute_s))


def breakdown_rows(breakdowns: Mapping[str, StepBreakdown]) -> list[dict[str, Any]]:
    """One table row per named breakdown (for ``cu.show_table``): ms per step of each part,
    the input share and the bottleneck."""
    rows = []
    for name, breakdown in breakdowns.items():
        parts = {f"{part} (ms)": getattr(breakdown, f"{part}_s") * 1e3
                 for part in ("input", "compute", "communication", "other")}
        rows.append({"run": name, "step (ms)": breakdown.step_s * 1e3, **parts,
                     "input share": breakdown.shares()["input"],
                     "bottleneck": breakdown.bottleneck(), "steps": breakdown.steps})
    return rows


def format_breakdown(breakdown: StepBreakdown) -> str:
    """A short table of a step breakdown: milliseconds and share per part, and the bottleneck."""
    shares = breakdown.shares()
    rows = [("input", breakdown.input_s), ("compute", breakdown.compute_s),
             ("communication", breakdown.communication_s), ("other", breakdown.other_s)]
    lines = [f"{'part':<14}{'ms/step':>10}{'share':>8}"]
    lines += [f"{name:<14}{seconds * 1e3:>10.2f}{shares[name]:>8.0%}" for name, seconds in rows]
    lines.append(f"{'step':<14}{breakdown.step_s * 1e3:>10.2f}{'':>8}  "
                 f"(median of {breakdown.steps} steps)")
    lines.append(f"bottleneck: {breakdown.bottleneck()}")
    return "\n".join(lines)
