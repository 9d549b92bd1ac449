"""Diagrams of lesson 09: the capstone's stages in the lesson's order, the order of an
accumulated step's micro-batches, and a profiler trace as a timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_utils.plots.style import PALETTE, axes_for

__all__ = ["CAPSTONE_STAGES", "draw_capstone_job", "draw_micro_batch_order", "trace_timeline"]

#: The stages of the capstone, in the lesson's order: what the job does ("job") and what
#: measures it ("measure"); the fix found by the profile changes the pipeline.
CAPSTONE_STAGES = (
    ("job", "dataset", "tfds.load"),
    ("job", "pipeline", "cache · shuffle\nbatch · prefetch"),
    ("measure", "benchmark", "every option, same\nbatches, medians"),
    ("job", "choices", "yours, from\nmeasured numbers"),
    ("job", "pre-train", "a small CNN\non part of the task"),
    ("job", "fine-tune", "head, then all at\na low rate; BN frozen"),
    ("measure", "profile", "trace a few steps"),
    ("measure", "bottleneck", "input, compute or\ncommunication?"),
    ("measure", "fix", "the largest share;\nan ablation"),
    ("measure", "report", "yours, from\nthe table"),
)


def draw_capstone_job(choices: Mapping[str, str] | None = None, ax: Any = None) -> Any:
    """The capstone's stages in the lesson's order, as a path in two rows: left to right from
    the dataset to fine-tuning (the benchmark before the choices), then right to left from
    the profile to the report; the job's stages in one colour, the measurements in another,
    and the fix feeding back into the pipeline. ``choices`` replaces a stage's second line
    (e.g. what this machine chose)."""
    ax = axes_for(ax, (12.0, 3.4))
    colors = {"job": PALETTE[0], "measure": PALETTE[2]}
    top, bottom = CAPSTONE_STAGES[:6], CAPSTONE_STAGES[6:]
    width = 1 / len(top)
    places: dict[str, tuple[float, float]] = {}
    for index, stage in enumerate(top):
        places[stage[1]] = ((index + 0.5) * width, 0.72)
    for index, stage in enumerate(bottom):  # right to left, the profile under fine-tune
        places[stage[1]] = ((len(top) - index - 0.5) * width, 0.24)
    arrow = {"arrowstyle": "->", "color": "grey", "lw": 1.5}
    for number, (kind, name, detail) in enumerate(CAPSTONE_STAGES):
        x, y = places[name]
        detail = (choices or {}).get(name, detail)
        ax.annotate(f"{name}\n{detail}", (x, y), ha="center", va="center", fontsize=8,
                    color="white", bbox={"boxstyle": "round,pad=0.5",
                                         "facecolor": colors[kind], "edgecolor": colors[kind]})
        if number:
            (px, py), gap = places[CAPSTONE_STAGES[number - 1][1]], 0.42 * width
            if py == y:  # along a row
                step = gap if x > px else -gap
                ax.annotate("", (x - step, y), (px + step, y), arrowprops=arrow)
            else:  # down, from the end of the top row
                ax.annotate("", (x, y + 0.12), (px, py - 0.12), arrowprops=arrow)
    ax.annotate("", (places["pipeline"][0] + 0.03, 0.60), (places["fix"][0] - 0.03, 0.36),
                arrowprops={**arrow, "color": PALETTE[3], "linestyle": "--"})
    ax.annotate("the fix changes the job", ((places["pipeline"][0] + places["fix"][0]) / 2,
                                            0.40), ha="right", fontsize=8, color=PALETTE[3])
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.set_axis_off()
    ax.set_title("The capstone in the lesson's order: the job (blue) and what measures it "
                 "(green)", fontsize=10)
    return ax


def draw_micro_batch_order(k: int = 3, ax: Any = None) -> Any:
    """An accumulation step of ``k`` micro-batches on a timeline, twice: without an order
    (inside a ``tf.function`` their forward passes may run side by side, each micro-batch's
    activations kept until its backward pass), and chained by ``tf.control_dependencies``
    (one after the other: one micro-batch's activations at a time). One update ends both."""
    from matplotlib.patches import Patch

    if k < 2:
        raise ValueError(f"accumulation needs k >= 2 micro-batches, got {k}")
    colors = {"forward": PALETTE[0], "backward": PALETTE[2], "apply": PALETTE[3]}
    lanes = [(f"micro-batch {i + 1}", [(0.0, "forward", i), (1.0, "backward", i)])
             for i in range(k)]
    lanes[-1][1].append((2.0, "apply", None))
    lanes.append(("one after the other", [(float(2 * i + j), kind, i) for i in range(k)
                                          for j, kind in enumerate(("forward", "backward"))]
                  + [(2.0 * k, "apply", None)]))
    ax = axes_for(ax, (9.0, 0.45 * (k + 1) + 1.6))
    for row, (_, bars) in enumerate(lanes):
        y = row + (row == k) * 0.5  # a gap between the two ways
        for start, kind, micro_batch in bars:
            width = 0.5 if kind == "apply" else 1.0
            ax.broken_barh([(start, width)], (y - 0.35, 0.7), color=colors[kind])
            ax.text(start + width / 2, y, "apply" if micro_batch is None
                    else f"{kind[0].upper()}{micro_batch + 1}",
                    ha="center", va="center", fontsize=8, color="white")
    ax.text(2.7, (k - 1) / 2, f"no order: {k} micro-batches' activations\nheld at once",
            va="center", fontsize=8)
    ax.text(2 * k + 0.7, k + 0.5, "chained: one micro-batch's\nactivations at a time",
            va="center", fontsize=8)
    ax.set_yticks([row + (row == k) * 0.5 for row in range(k + 1)],
                  [name for name, _ in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.legend(handles=[Patch(color=c, label=name) for name, c in colors.items()],
              loc="upper right", fontsize=8, ncol=1)
    ax.set(xlim=(0, 2 * k + 4), xlabel="time (one forward or backward pass = 1)",
           title=f"One update from k = {k} micro-batches: no order (top), chained (bottom)")
    return ax


#: Colours of the timeline's span categories.
_TIMELINE_COLORS = {"input": PALETTE[3], "compute": PALETTE[0], "communication": PALETTE[2]}


def trace_timeline(events: Sequence[Mapping[str, Any]], steps: int = 2, max_threads: int = 8,
                   ax: Any = None) -> Any:
    """The first ``steps`` profiled steps of a trace as a timeline, like TensorBoard's trace
    viewer: one row per busy thread, each op's span coloured as input, compute or
    communication (``cu.profiling.spans``), the steps shaded behind them."""
    from matplotlib.patches import Patch

    from course_utils.profiling import spans, step_windows

    windows = step_windows(events)[:steps]
    if not windows:
        raise ValueError("no profiled steps in these events: trace steps with "
                         "tf.profiler.experimental.Trace('train', step_num=..., _r=1)")
    start, end = windows[0][0], windows[-1][1]
    shown = [span for span in spans(events) if span.end > start and span.start < end]
    busy: dict[str, float] = {}
    for span in shown:
        busy[span.thread] = busy.get(span.thread, 0.0) + span.end - span.start
    threads = sorted(busy, key=lambda thread: -busy[thread])[:max_threads]
    ax = axes_for(ax, (10.0, 0.45 * len(threads) + 1.4))
    for number, (left, right) in enumerate(windows):
        ax.axvspan((left - start) / 1e3, (right - start) / 1e3, color="grey",
                   alpha=0.12 if number % 2 == 0 else 0.06)
    for row, thread in enumerate(threads):
        for category, color in _TIMELINE_COLORS.items():
            bars = [((span.start - start) / 1e3, (span.end - span.start) / 1e3)
                    for span in shown if span.thread == thread and span.category == category]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), color=color)
    handles = [Patch(color=color, label=name) for name, color in _TIMELINE_COLORS.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    ax.set_yticks(range(len(threads)), [thread[:28] for thread in threads], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlim=(0, (end - start) / 1e3), xlabel="ms from the first profiled step",
           title=f"The trace: {len(windows)} profiled step(s) (shaded), busiest threads")
    return ax
